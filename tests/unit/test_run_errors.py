"""A launch that dies is recorded with the worker's own error line, not a generic message."""

from types import SimpleNamespace

from amdahl.run import _launch_error


def test_launch_error_reads_tunes_local_error_file(tmp_path):
    path = tmp_path / "error.txt"
    path.write_text(
        "Failure # 1 (occurred at 2026-11-22_15-39-35)\n"
        "ray.train.WorkerGroupError: Training failed due to worker errors:\n"
        '  File "harness.py", line 1, in train_launch\n'
        "RuntimeError: CUDA error: an illegal memory access was encountered\n\n"
    )
    trial = SimpleNamespace(error_file=str(path), get_error=lambda: None)
    assert _launch_error(trial) == (
        "launch failed: RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def test_launch_error_without_any_error_points_to_the_log(tmp_path):
    trial = SimpleNamespace(error_file=str(tmp_path / "missing.txt"), get_error=lambda: None)
    assert "see ray.log in the sweep directory" in _launch_error(trial)


def _crashed_launch(tmp_path, relaunch: bool, reported: set, skip: list):
    from amdahl.run import SweepOutcome, _ResultSink

    settings = {
        "devices": 1,
        "batch_size": 32,
        "per_device_batch": 32,
        "params": {},
        **{k: "x" for k in ("precision", "compile", "sync", "input")},
        "data_workers": 1,
        "prefetch_batches": 1,
    }
    config = {
        "launch_id": "L",
        "sweep": "s",
        "workload": "mlp",
        "scaling": "weak",
        "steps": 10,
        "warmup_steps": 1,
        "repeats": 2,
        "relaunch": relaunch,
        "skip": skip,
        "trials": [{"trial_id": t, "settings": settings} for t in ("a", "b", "c")],
    }
    error_file = tmp_path / "error.txt"
    error_file.write_text("RuntimeError: worker died\n")
    sink = _ResultSink(
        tmp_path,
        {},
        SweepOutcome(sweep_dir=tmp_path, plan=None),
        SimpleNamespace(log_trial_soon=lambda row: None),
        lambda kind, payload: None,
    )
    sink.reported["L"] = set(reported)
    trial = SimpleNamespace(config={"launch": config}, error_file=str(error_file))
    sink.on_trial_error(0, [], trial)
    return [(r["trial_id"], r["repeat"]) for r in sink.outcome.rows], sink.relaunch


def test_a_crash_costs_the_trial_it_hit_and_the_rest_run_again(tmp_path):
    failed, relaunch = _crashed_launch(
        tmp_path, relaunch=False, reported={("a", 0)}, skip=[["a", 1]]
    )
    assert failed == [("b", 0)]  # a/0 reported, a/1 finished before a resume: b/0 was running
    assert relaunch == {"b", "c"}  # b/1 and c's repeats run in a new launch


def test_a_relaunch_dying_in_its_first_trial_fails_what_it_had_left(tmp_path):
    failed, relaunch = _crashed_launch(tmp_path, relaunch=True, reported=set(), skip=[])
    assert failed == [(t, r) for t in "abc" for r in (0, 1)] and relaunch == set()
