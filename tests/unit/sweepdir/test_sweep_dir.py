"""One driver per sweep directory, resumes that cannot mix settings, SIGTERM stops cleanly.

No Ray is started here: every refusal below happens before the driver would start it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from amdahl.driver import sweep as run
from amdahl.driver.signals import InterruptFlag, SweepInterrupted
from amdahl.driver.sweep import run_sweep
from amdahl.errors import UserError
from amdahl.spec.load import validate_spec
from amdahl.sweepdir import layout
from amdahl.sweepdir.layout import (
    FINGERPRINT_FILE,
    LOCK_FILE,
    RESULTS_FILE,
    SPEC_FILE,
    latest_sweep_dir,
    new_sweep_dir,
)
from amdahl.sweepdir.lock import lock_sweep_dir
from amdahl.sweepdir.resume import open_sweep_dir, spec_changes, write_fingerprint
from amdahl.sweepdir.table import append_rows, read_results

BASE = {
    "name": "fp",
    "workload": "mlp",
    "params": {"hidden": [32], "train_rows": 2048},
    "train": {"steps": 150, "warmup_steps": 2},
    "grid": {"batch_size": [32, 64], "sync": ["ddp", "none"]},
    "resources": {"cpus_per_device": 0.5},
}


def _spec(changes: dict | None = None):
    raw = json.loads(json.dumps(BASE))
    for dotted, value in (changes or {}).items():
        *parents, leaf = dotted.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return validate_spec(raw)


def _sweep_dir(tmp_path: Path, spec=None) -> Path:
    """A sweep directory as a driver leaves it: spec.yaml, fingerprint.json, one row."""
    spec = spec or _spec()
    path = tmp_path / "runs" / "fp-20250101T120000Z"
    path.mkdir(parents=True)
    (path / SPEC_FILE).write_text(yaml.safe_dump(spec.model_dump(), sort_keys=False))
    write_fingerprint(path, spec)
    append_rows(path, [{"sweep": "fp", "trial_id": "t1", "repeat": 0, "status": "ok"}])
    return path


# --------------------------------------------------------------------------- the lock


def test_a_second_driver_is_refused_naming_the_first(tmp_path):
    lock = lock_sweep_dir(tmp_path)
    try:
        with pytest.raises(UserError) as e:
            lock_sweep_dir(tmp_path)
        message = str(e.value)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in message
        assert "in use by another sweep driver" in message and "--resume" in message
    finally:
        lock.release()
    lock_sweep_dir(tmp_path).release()  # released: the next driver gets it


def test_the_refusal_says_what_holds_the_directory_and_what_to_do(tmp_path):
    with lock_sweep_dir(tmp_path, by="MLflow push", advice="wait for the push"):
        with pytest.raises(UserError) as e:
            lock_sweep_dir(tmp_path)
    assert "in use by another MLflow push (pid " in str(e.value)
    assert str(e.value).endswith("--resume to start a new sweep directory")  # the driver's
    with lock_sweep_dir(tmp_path):  # a record written before holders said what they are
        (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "h", "since": "t"}))
        with pytest.raises(UserError) as e:
            lock_sweep_dir(tmp_path, by="MLflow push")
    assert "in use by another sweep driver (pid 1 on host h, running since t)" in str(e.value)


def test_the_lock_dies_with_its_driver(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from amdahl.sweepdir.lock import lock_sweep_dir\n"
            "held = lock_sweep_dir(Path(sys.argv[1]))\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=f"pid {holder.pid} on host "):
            lock_sweep_dir(tmp_path)
    finally:
        holder.kill()  # SIGKILL: no cleanup of its own runs
        holder.wait()
    lock_sweep_dir(tmp_path).release()


def _no_ray_start(monkeypatch) -> bool:
    """Make starting Ray fail the test; returns whether Ray was already up in this process
    (the integration tests' session Ray may be), which a refused driver must leave as it is."""
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started before the refusal")

    monkeypatch.setattr(run, "connect_ray", refuse)
    return ray.is_initialized()


def test_resuming_a_directory_in_use_is_refused_before_ray_starts(tmp_path, monkeypatch):
    import ray

    ray_was_up = _no_ray_start(monkeypatch)
    sweep_dir = _sweep_dir(tmp_path)
    lock = lock_sweep_dir(sweep_dir)
    try:
        with pytest.raises(UserError, match=f"pid {os.getpid()}"):
            run_sweep(_spec(), resume=sweep_dir, tracking=False)
    finally:
        lock.release()
    assert ray.is_initialized() == ray_was_up
    assert read_results(sweep_dir).num_rows == 1


def test_nothing_to_resume_leaves_no_lock_file_behind(tmp_path):
    with pytest.raises(UserError, match="nothing to resume"):
        run_sweep(_spec(), resume=tmp_path, tracking=False)
    assert not (tmp_path / LOCK_FILE).exists()


# --------------------------------------------------------------------------- new directories


class _SameSecond(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def test_a_directory_made_by_another_driver_after_the_check_is_not_shared(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "datetime", _SameSecond)
    runs = tmp_path / "runs"
    (runs / "s-20250101T120000Z").mkdir(parents=True)
    # The other driver's mkdir lands between any existence check and ours.
    monkeypatch.setattr(Path, "exists", lambda self: False)
    made = new_sweep_dir(runs, "s")
    monkeypatch.undo()
    assert made.name == "s-20250101T120000Z-2"


def test_sweeps_started_in_the_same_second_each_get_their_own_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "datetime", _SameSecond)
    runs, made, errors = tmp_path / "runs", [], []
    start = threading.Barrier(8)

    def make() -> None:
        start.wait()
        try:
            made.append(new_sweep_dir(runs, "s"))
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(p.name for p in made) == sorted(
        ["s-20250101T120000Z", *(f"s-20250101T120000Z-{i}" for i in range(2, 9))]
    )


def test_a_new_sweep_directory_is_locked_by_its_driver(tmp_path):
    sweep_dir, finished, lock, created = open_sweep_dir(
        _spec(), tmp_path / "runs", None, False, False
    )
    try:
        assert created and finished == set() and sweep_dir.parent == tmp_path / "runs"
        with pytest.raises(UserError, match="in use by another sweep driver"):
            lock_sweep_dir(sweep_dir)
    finally:
        lock.release()


# --------------------------------------------------------------------------- --resume's choice


def test_resume_without_a_directory_matches_the_sweep_name_exactly(tmp_path):
    own = tmp_path / "scaling-20250101T120000Z"
    other = tmp_path / "scaling-big-20250102T120000Z"
    stray = tmp_path / "scaling-notes"
    for d in (own, other, stray):
        d.mkdir()
    os.utime(own, (1_000, 1_000))  # the other sweep's directory and the stray one are newer
    assert latest_sweep_dir(tmp_path, "scaling") == own
    second = tmp_path / "scaling-20250101T120000Z-2"
    second.mkdir()
    assert latest_sweep_dir(tmp_path, "scaling") == second
    assert latest_sweep_dir(tmp_path, "scaling-big") == other


def test_resume_without_a_directory_never_takes_another_sweeps(tmp_path):
    (tmp_path / "scaling-big-20250102T120000Z").mkdir()
    with pytest.raises(UserError, match="no earlier sweep named 'scaling'"):
        latest_sweep_dir(tmp_path, "scaling")


# --------------------------------------------------------------------------- the fingerprint


@pytest.mark.parametrize(
    "dotted, value, shown",
    [
        ("train.steps", 20, "train.steps: 150 -> 20"),
        ("train.warmup_steps", 5, "train.warmup_steps: 2 -> 5"),
        ("train.lr", 0.1, "train.lr: 0.05 -> 0.1"),
        ("train.optimizer", "adamw", 'train.optimizer: "sgd" -> "adamw"'),
        ("resources.cpus_per_device", 1.0, "resources.cpus_per_device: 0.5 -> 1.0"),
        ("params.hidden", [64], "params.hidden: [32] -> [64]"),
        ("params.val_rows", 256, "params.val_rows: (unset) -> 256"),
        ("options.bucket_cap_mb", 50.0, "options.bucket_cap_mb: 25.0 -> 50.0"),
        ("isolation", "shared", 'isolation: "exclusive" -> "shared"'),
    ],
)
def test_a_resume_with_other_measurement_settings_is_refused(
    tmp_path, monkeypatch, dotted, value, shown
):
    import ray

    ray_was_up = _no_ray_start(monkeypatch)
    sweep_dir = _sweep_dir(tmp_path)
    spec_before = (sweep_dir / SPEC_FILE).read_text()
    with pytest.raises(UserError) as e:
        run_sweep(_spec({dotted: value}), resume=sweep_dir, tracking=False)
    message = str(e.value)
    assert f"--resume {sweep_dir}: these settings differ" in message
    assert f"  {shown}\n" in message and "--new-if-changed" in message
    assert ray.is_initialized() == ray_was_up
    assert (sweep_dir / SPEC_FILE).read_text() == spec_before  # not replaced
    lock_sweep_dir(sweep_dir).release()  # the refused driver let go of the directory


def test_every_differing_setting_is_listed(tmp_path):
    sweep_dir = _sweep_dir(tmp_path)
    changed = _spec({"train.steps": 20, "train.lr": 0.1, "resources.cpus_per_device": 1.0})
    assert spec_changes(sweep_dir, changed) == [
        ("resources.cpus_per_device", 0.5, 1.0),
        ("train.lr", 0.05, 0.1),
        ("train.steps", 150, 20),
    ]


@pytest.mark.parametrize(
    "dotted, value",
    [
        ("name", "renamed"),
        ("tracking.uri", "sqlite:///elsewhere.db"),
        ("tracking.enabled", False),
        ("report.cost_per_device_hour", 2.5),
        ("storage", "/mnt/shared/amdahl"),
        ("train.repeats", 3),
        ("train.max_failures", 2),
        ("grid.batch_size", [32, 64, 128]),
        ("exclude", [{"batch_size": 32, "sync": "none"}]),
    ],
)
def test_settings_that_change_no_measurement_may_change_on_resume(tmp_path, dotted, value):
    assert spec_changes(_sweep_dir(tmp_path), _spec({dotted: value})) == []


def test_a_directory_written_before_fingerprints_is_checked_against_its_spec_file(tmp_path):
    sweep_dir = _sweep_dir(tmp_path)
    (sweep_dir / FINGERPRINT_FILE).unlink()
    assert spec_changes(sweep_dir, _spec({"tracking.enabled": False})) == []
    assert spec_changes(sweep_dir, _spec({"train.steps": 20})) == [("train.steps", 150, 20)]


def test_a_field_added_to_amdahl_later_blocks_no_resume_at_its_default(tmp_path):
    sweep_dir = _sweep_dir(tmp_path)
    path = sweep_dir / FINGERPRINT_FILE
    record = json.loads(path.read_text())
    del record["measured"]["options"]["compile_cache"]  # as an older amdahl wrote it
    record["fingerprint"] = "older"
    path.write_text(json.dumps(record))
    assert spec_changes(sweep_dir, _spec()) == []
    [(key, _, new)] = spec_changes(sweep_dir, _spec({"options.compile_cache": "warm"}))
    assert (key, new) == ("options.compile_cache", "warm")


def test_an_unreadable_record_is_refused_with_the_fix(tmp_path):
    sweep_dir = _sweep_dir(tmp_path)
    (sweep_dir / FINGERPRINT_FILE).write_text("{not json")
    (sweep_dir / SPEC_FILE).write_text("[1, 2")
    with pytest.raises(UserError, match="cannot tell which settings.*--new-if-changed"):
        spec_changes(sweep_dir, _spec())


def test_new_if_changed_starts_a_new_directory_and_lets_go_of_the_old(tmp_path, caplog):
    sweep_dir = _sweep_dir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="amdahl.sweepdir.resume"):
        new_dir, finished, lock, created = open_sweep_dir(
            _spec({"train.steps": 20}), tmp_path / "runs", sweep_dir, False, True
        )
    try:
        assert created and new_dir != sweep_dir and new_dir.parent == sweep_dir.parent
        assert finished == set()
        assert "train.steps: 150 -> 20" in caplog.text
    finally:
        lock.release()
    lock_sweep_dir(sweep_dir).release()


def test_a_matching_resume_keeps_its_directory_and_finished_rows(tmp_path):
    sweep_dir = _sweep_dir(tmp_path)
    same_dir, finished, lock, created = open_sweep_dir(
        _spec({"train.repeats": 2}), tmp_path / "runs", sweep_dir, False, True
    )
    lock.release()
    assert (same_dir, finished, created) == (sweep_dir, {("t1", 0)}, False)


def test_new_if_changed_needs_resume(tmp_path):
    spec = tmp_path / "fp.yaml"
    spec.write_text(yaml.safe_dump(BASE))
    from amdahl.cli.commands import main

    result = CliRunner().invoke(main, ["sweep", str(spec), "--new-if-changed"])
    assert result.exit_code == 2
    assert "--new-if-changed only makes sense with --resume" in result.output


# --------------------------------------------------------------------------- SIGTERM


def test_sigterm_stops_the_sweep_as_ctrl_c_does(monkeypatch):
    monkeypatch.setenv("TUNE_DISABLE_SIGINT_HANDLER", "1")  # installed() sets it; restored
    received: list[int] = []

    def recorder(signum, frame):
        received.append(signum)

    previous = signal.signal(signal.SIGTERM, recorder)  # before the fix, SIGTERM lands here
    try:
        flag = InterruptFlag()
        with flag.installed():
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 5
            while not flag.is_set() and not received and time.monotonic() < deadline:
                time.sleep(0.01)
            assert flag.is_set() and flag.signum == signal.SIGTERM and flag.stop_all()
            assert received == []
            os.kill(os.getpid(), signal.SIGTERM)  # a second one: the handler it had before
            deadline = time.monotonic() + 5
            while not received and time.monotonic() < deadline:
                time.sleep(0.01)
            assert received == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is recorder
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_sweep_stopped_by_sigterm_exits_143_with_the_resume_command(tmp_path, monkeypatch):
    spec = tmp_path / "fp.yaml"
    spec.write_text(yaml.safe_dump(BASE))
    stopped = tmp_path / "runs" / "fp-20250101T120000Z"

    def stop(*args, **kwargs):
        raise SweepInterrupted(stopped, signal.SIGTERM)

    monkeypatch.setattr(run, "run_sweep", stop)
    from amdahl.cli.commands import main

    result = CliRunner().invoke(main, ["sweep", str(spec), "--set", "train.steps=20"])
    assert result.exit_code == 143
    assert f"stopped by SIGTERM: finished trials are saved in {stopped}" in result.output
    assert f"resume with: platform sweep {spec} --set train.steps=20 --resume {stopped}" in (
        result.output
    )
    assert SweepInterrupted(stopped).exit_code == 130


def test_results_temporary_files_are_never_shared_between_writers(tmp_path, monkeypatch):
    """A second writer finishing while the first one is about to rename its temporary file
    (two drivers, before the lock) must not have written over or moved that file."""
    original, nested = os.replace, []

    def replace(src, dst, *args, **kwargs):
        if not nested:
            nested.append(Path(src).name)
            append_rows(tmp_path, [{"sweep": "s", "trial_id": "b", "repeat": 0}])
        return original(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    append_rows(tmp_path, [{"sweep": "s", "trial_id": "a", "repeat": 0}])
    monkeypatch.undo()
    assert nested and nested[0] != "results.parquet.tmp"
    assert read_results(tmp_path)["trial_id"].to_pylist() == ["a"]  # the last writer's table
    assert [p.name for p in tmp_path.iterdir()] == [RESULTS_FILE]


def test_a_directory_from_before_resources_auto_resumes_under_auto(tmp_path):
    # An older amdahl recorded cpus_per_device 1.0 (its default); the same sweep file without
    # `resources:` now means auto. The planner picks the numbers (and trial ids hash them).
    old = _sweep_dir(tmp_path, _spec({"resources.cpus_per_device": 1.0}))
    (old / FINGERPRINT_FILE).unlink()
    auto = _spec({"resources": {}})
    assert auto.resources.cpus_per_device is None
    assert spec_changes(old, auto) == []
    assert spec_changes(old, _spec({"resources.cpus_per_device": 0.5})) == [
        ("resources.cpus_per_device", 1.0, 0.5)
    ]
