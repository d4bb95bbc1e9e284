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
