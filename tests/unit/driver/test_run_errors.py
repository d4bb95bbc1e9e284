"""A launch that dies is recorded with the worker's own error line, not a generic message."""

from types import SimpleNamespace

from amdahl.driver.results_sink import launch_error


def test_launch_error_reads_tunes_local_error_file(tmp_path):
    path = tmp_path / "error.txt"
    path.write_text(
        "Failure # 1 (occurred at 2026-11-22_15-39-35)\n"
        "ray.train.WorkerGroupError: Training failed due to worker errors:\n"
        '  File "harness.py", line 1, in train_launch\n'
        "RuntimeError: CUDA error: an illegal memory access was encountered\n\n"
    )
    trial = SimpleNamespace(error_file=str(path), get_error=lambda: None)
    assert launch_error(trial) == (
        "launch failed: RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def test_launch_error_without_any_error_points_to_the_log(tmp_path):
    trial = SimpleNamespace(error_file=str(tmp_path / "missing.txt"), get_error=lambda: None)
    assert "see ray.log in the sweep directory" in launch_error(trial)


def _crashed_launch(tmp_path, relaunch: bool, reported: set, skip: list):
    """A three-trial, two-repeat launch whose worker group died: the rows the driver records."""
    import dataclasses

    from trial_runner import launch_config, trial_config

    from amdahl.driver.launches import Measurement
    from amdahl.driver.results_sink import ResultSink
    from amdahl.sweepdir.table import read_results

    trials = tuple(trial_config(trial_id=t) for t in ("a", "b", "c"))
    launch = dataclasses.replace(
        launch_config(trials, repeats=2),
        launch_id="L",
        skip=tuple(tuple(pair) for pair in skip),
        relaunch=relaunch,
    )
    error_file = tmp_path / "error.txt"
    error_file.write_text("RuntimeError: worker died\n")
    run = Measurement(
        spec=None,
        plan=None,
        sweep_dir=tmp_path,
        rows=[],
        tracker=SimpleNamespace(log_trial_soon=lambda row: None),
        emit=lambda kind, payload: None,
        interrupt=None,
        group=True,
        across_devices=True,
    )
    sink = ResultSink({}, {"L": launch}, run.record, run.emit)
    sink.reported["L"] = set(reported)
    trial = SimpleNamespace(config={"launch_id": "L"}, error_file=str(error_file))
    sink.on_trial_error(0, [], trial)
    rows = run.rows
    # Failed rows carry the same identity columns as measured ones (results.row_identity).
    assert all(r["target"] is None and r["scaling"] == "weak" and r["steps"] == 8 for r in rows)
    assert all(r["status"] == "failed" and "worker died" in r["error"] for r in rows)
    assert read_results(tmp_path).num_rows == len(rows)  # written to results.parquet first
    return [(r["trial_id"], r["repeat"]) for r in rows], sink.relaunch


def test_a_crash_costs_the_trial_it_hit_and_the_rest_run_again(tmp_path):
    failed, relaunch = _crashed_launch(
        tmp_path, relaunch=False, reported={("a", 0)}, skip=[["a", 1]]
    )
    assert failed == [("b", 0)]  # a/0 reported, a/1 finished before a resume: b/0 was running
    assert relaunch == {"b", "c"}  # b/1 and c's repeats run in a new launch


def test_a_relaunch_dying_in_its_first_trial_fails_what_it_had_left(tmp_path):
    failed, relaunch = _crashed_launch(tmp_path, relaunch=True, reported=set(), skip=[])
    assert failed == [(t, r) for r in (0, 1) for t in "abc"] and relaunch == set()


def test_repeats_run_interleaved_so_a_crash_in_the_second_round_costs_one_run(tmp_path):
    """Repeat 1 of every trial runs after repeat 0 of every trial (LaunchConfig.schedule): a
    death after a/1 was reported lands on b/1, and only c/1 is left to run again."""
    failed, relaunch = _crashed_launch(
        tmp_path, relaunch=False, reported={("a", 0), ("b", 0), ("c", 0), ("a", 1)}, skip=[]
    )
    assert failed == [("b", 1)]
    assert relaunch == {"c"}
