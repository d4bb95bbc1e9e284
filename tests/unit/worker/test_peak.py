"""The peak-FLOP/s probe shared by the harness and `platform calibrate` (amdahl.worker.peak)."""

import time

import pytest
import torch

from amdahl.worker import peak

CPU = torch.device("cpu")
_MM = torch.mm  # the real matmul, for spies that replace torch.mm


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch):
    """An empty cache and a short timed window, so each test measures, and quickly."""
    monkeypatch.setattr(peak, "_CACHE", {})
    monkeypatch.setattr(peak, "MIN_SECONDS", 0.02)
    saved = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


class _FakeClock:
    """`time.perf_counter` for the probe, advanced only by the matmuls it makes (each `DT_S`)."""

    DT_S = 2.0**-8  # exact in binary: the window adds up to MIN_SECONDS without rounding

    def __init__(self) -> None:
        self.now = 100.0
        self.sizes: list[int] = []

    def perf_counter(self) -> float:
        return self.now

    def mm(self, a, b, **kw):
        self.sizes.append(a.shape[0])
        self.now += self.DT_S
        return _MM(a, b, **kw)


def test_peak_is_matmul_flops_over_the_timed_window(monkeypatch):
    """Each timed n x n matmul is 2 n^3 FLOPs and the window is the clock's: on a clock that
    moves DT_S per matmul the probe must give exactly 2 n^3 / DT_S (warmup matmuls excluded,
    whatever the window length)."""
    clock = _FakeClock()
    monkeypatch.setattr(peak.time, "perf_counter", clock.perf_counter)
    monkeypatch.setattr(peak.torch, "mm", clock.mm)
    monkeypatch.setattr(peak, "MIN_SECONDS", 7 * _FakeClock.DT_S)
    got = peak.measure_peak_flops(CPU, "fp32")
    n = clock.sizes[0]
    assert set(clock.sizes) == {n}
    assert len(clock.sizes) == peak.WARMUP + 7
    assert got == pytest.approx(2 * n**3 / _FakeClock.DT_S, rel=1e-9)


def _independent_fp32_flops(n: int, seconds: float) -> float:
    """Square fp32 matmuls timed here, apart from the probe: 2 n^3 FLOPs each, best of 3."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = 0.0
    for _ in range(3):
        reps, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 3:
            torch.mm(a, b)
            reps += 1
        best = max(best, 2 * n**3 * reps / elapsed)
    return best


def test_cpu_peak_agrees_with_an_independent_matmul_timing(monkeypatch):
    """Against square matmuls of another size timed by this test: the same order of magnitude
    (a wrong exponent, unit or count is off by 100x or more; the exact arithmetic is checked
    above). Timings alternate with the probe so that a busy machine slows both alike."""
    monkeypatch.setattr(peak, "MIN_SECONDS", 0.1)
    before = _independent_fp32_flops(384, 0.15)
    probe = peak.measure_peak_flops(CPU, "fp32")
    after = _independent_fp32_flops(384, 0.15)
    assert min(before, after) / 3 < probe < 3 * max(before, after), (before, probe, after)


def test_peak_is_measured_once_per_process(monkeypatch):
    first = peak.measure_peak_flops(CPU, "fp32")
    calls = []
    monkeypatch.setattr(peak, "_time_matmuls", lambda *a: calls.append(a) or 1.0)
    assert peak.measure_peak_flops(CPU, "fp32") == first  # cached: no second measurement
    assert calls == []


def test_tf32_on_cpu_is_fp32_and_bf16_weights_is_bf16():
    assert peak.measure_peak_flops(CPU, "tf32") == peak.measure_peak_flops(CPU, "fp32")
    assert peak.measure_peak_flops(CPU, "bf16_weights") == peak.measure_peak_flops(CPU, "bf16")
    assert len(peak._CACHE) == 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precisions_run_in_their_own_dtype(monkeypatch, precision):
    seen = []
    mm = torch.mm

    def spy(a, b, **kw):
        seen.append(a.dtype)
        return mm(a, b, **kw)

    monkeypatch.setattr(peak.torch, "mm", spy)
    peak.measure_peak_flops(CPU, precision)
    assert set(seen) == {peak.precision_dtype(precision)}
    assert len(seen) >= peak.WARMUP + 1


@pytest.mark.parametrize("before", [True, False])
def test_tf32_flag_set_for_the_probe_and_restored(monkeypatch, before):
    flags = []
    mm = torch.mm

    def spy(a, b, **kw):
        flags.append(torch.backends.cuda.matmul.allow_tf32)
        return mm(a, b, **kw)

    monkeypatch.setattr(peak.torch, "mm", spy)
    torch.backends.cuda.matmul.allow_tf32 = before
    peak.measure_peak_flops(CPU, "fp32")
    assert set(flags) == {False}  # fp32 is IEEE fp32, whatever the trial had set
    assert torch.backends.cuda.matmul.allow_tf32 is before


def test_tf32_flag_restored_when_the_probe_fails(monkeypatch):
    def boom(*a, **kw):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(peak.torch, "mm", boom)
    torch.backends.cuda.matmul.allow_tf32 = True
    with pytest.raises(RuntimeError, match="out of memory"):
        peak.measure_peak_flops(CPU, "fp32")
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert peak._CACHE == {}


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        peak.measure_peak_flops(CPU, "fp8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_probe_uses_tf32_for_tf32_only_and_leaves_no_memory(monkeypatch):
    device = torch.device("cuda")
    flags = []
    mm = torch.mm

    def spy(a, b, **kw):
        flags.append((a.dtype, torch.backends.cuda.matmul.allow_tf32))
        return mm(a, b, **kw)

    monkeypatch.setattr(peak.torch, "mm", spy)
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype in (torch.float32, torch.bfloat16):  # cuBLAS keeps a workspace once it has run
        torch.ones(8, 8, device=device, dtype=dtype) @ torch.ones(8, 8, device=device, dtype=dtype)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    peaks = {p: peak.measure_peak_flops(device, p) for p in ("fp32", "tf32", "bf16", "fp16")}
    assert torch.cuda.memory_allocated() == allocated
    assert torch.cuda.memory_reserved() == reserved
    assert {f for f in flags if f[0] == torch.float32} == {
        (torch.float32, False),
        (torch.float32, True),
    }
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert peaks["tf32"] > peaks["fp32"]  # tensor cores: the reason tf32 needs its own peak
    # "cuda" and "cuda:<current>" are the same device: one cache entry each precision
    assert (
        peak.measure_peak_flops(torch.device("cuda", torch.cuda.current_device()), "fp32")
        == (peaks["fp32"])
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_peak_agrees_with_matmuls_timed_by_cuda_events(precision):
    """The probe's host clock + synchronize against the device's own timeline (CUDA events
    around a burst of the same matmuls): within 1.5x either way. Also the reason for the size:
    one matmul at `matrix_size` lasts long beside a synchronize (>= 0.3 ms even in bf16)."""
    device = torch.device("cuda", torch.cuda.current_device())
    probe = peak.measure_peak_flops(device, precision)
    n, dtype = peak.matrix_size(device), peak.precision_dtype(precision)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for _ in range(3):
            torch.mm(a, b)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 20
        start.record()
        for _ in range(reps):
            torch.mm(a, b)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
        del a, b
        torch.cuda.empty_cache()
    events = 2 * n**3 * reps / seconds
    assert events / 1.5 < probe < 1.5 * events, (probe, events)
    assert seconds / reps >= 3e-4, seconds / reps
