"""The utilisation sampler: its arithmetic on a fake clock, and busy against idle for real."""

import json
import time

import torch

from amdahl.worker import utilisation
from amdahl.worker.utilisation import UtilisationSampler


class FakeClocks:
    """Wall and process-CPU clocks the test advances by hand."""

    def __init__(self, monkeypatch, cores: int):
        self.wall = 100.0
        self.cpu = 5.0
        monkeypatch.setattr(utilisation.time, "perf_counter", lambda: self.wall)
        monkeypatch.setattr(utilisation, "_cpu_seconds", lambda: self.cpu)
        monkeypatch.setattr(utilisation, "allowed_cores", lambda: cores)

    def advance(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu


def test_cpu_percent_is_cpu_seconds_over_wall_over_allowed_cores(monkeypatch):
    clocks = FakeClocks(monkeypatch, cores=4)
    s = UtilisationSampler(torch.device("cpu"))
    s._t0 = s._last_wall = clocks.wall
    s._last_cpu = clocks.cpu
    clocks.advance(wall=1.0, cpu=2.0)  # two of four cores busy
    s._sample()
    clocks.advance(wall=0.5, cpu=2.0)  # all four busy
    s._sample()
    series = s.series()
    assert series["t"] == [1.0, 1.5]
    assert series["cpu_percent"] == [50.0, 100.0]
    assert "gpu_percent" not in series  # no GPU series on a CPU device


def test_thinning_halves_samples_and_keeps_the_time_weighted_mean(monkeypatch):
    clocks = FakeClocks(monkeypatch, cores=1)
    monkeypatch.setattr(utilisation, "MAX_SAMPLES", 4)
    s = UtilisationSampler(torch.device("cpu"), interval=0.25)
    s._t0 = s._last_wall = clocks.wall
    s._last_cpu = clocks.cpu
    for wall, cpu in [(1.0, 1.0), (3.0, 0.0), (2.0, 1.0), (2.0, 1.0)]:
        clocks.advance(wall, cpu)
        s._sample()
    series = s.series()
    assert series["t"] == [4.0, 8.0]
    # 1 CPU-second over the first 4 s, 2 over the next 4: time-weighted, not (100 + 0) / 2.
    assert series["cpu_percent"] == [25.0, 50.0]
    assert s._interval == 0.5


def test_a_busy_window_reads_busier_than_an_idle_one():
    def measure(busy: bool) -> float:
        s = UtilisationSampler(torch.device("cpu"), interval=0.05)
        s.start()
        end = time.perf_counter() + 0.6
        while time.perf_counter() < end:
            if not busy:
                time.sleep(0.01)
        s.stop()
        cpu = s.series()["cpu_percent"]
        assert len(cpu) >= 2
        return sum(cpu) / len(cpu)

    idle, busy = measure(False), measure(True)
    # One spinning thread is 100% of one allowed core; the idle loop is close to 0.
    assert busy > 3 * idle
    assert busy <= 100.0 * 1.05


def test_no_gpu_reader_on_cpu():
    assert utilisation.gpu_reader(torch.device("cpu")) is None


def test_columns_are_time_weighted_per_rank_and_median_over_ranks():
    from amdahl.worker.utilisation import utilisation_columns

    rank0 = {"t": [1.0, 4.0], "cpu_percent": [100.0, 0.0]}  # busy 1 s of 4: 25%
    rank1 = {"t": [2.0, 4.0], "cpu_percent": [50.0, 50.0], "gpu_percent": [None, 80.0]}
    cols = utilisation_columns([rank0, rank1, None])
    assert cols["cpu_utilisation"] == (25.0 + 50.0) / 2
    assert cols["gpu_utilisation"] == 80.0  # the None sample's period does not count
    assert json.loads(cols["utilisation"]) == [rank0, rank1, None]
    assert utilisation_columns([None])["cpu_utilisation"] is None
