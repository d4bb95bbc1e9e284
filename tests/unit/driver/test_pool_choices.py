"""The launch pool's two choices that cost or spare a worker-group start (driver/pool.py): which
group measures the closing calibration, and why each group started (the closing summary's)."""

from amdahl.driver.pool import calibration_launch, start_reason
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import Node
from amdahl.spec.load import validate_spec


def _launches(grid):
    """The sweep's launches, one per device count (a 1-worker and a 2-worker shape)."""
    spec = validate_spec({"name": "t", "workload": "mlp", "grid": grid})
    return plan_sweep(spec, [Node(cpus=8)], WorkloadFacts({})).launches(set(), True, False)


def test_the_calibration_runs_in_a_wide_group_that_is_still_up():
    # two 2-worker shapes (data_workers splits them) and two 1-worker ones
    launches = _launches({"devices": [1, 2], "data_workers": [1, 2]})
    wide = [launch for launch in launches if launch.resources.workers == 2]
    assert len(wide) == 2
    first, second = (launch.launch_id for launch in wide)
    # the first wide shape was closed to make room; the second is up: measure there
    assert calibration_launch(launches, {second}, 2).launch_id == second
    # none up: the first wide shape (a start); a narrower live group measures fewer counts
    narrow = next(launch.launch_id for launch in launches if launch.resources.workers == 1)
    assert calibration_launch(launches, {narrow}, 2).launch_id == first
    assert calibration_launch(launches, set(), 4) is None  # no shape has 4 workers


def test_each_start_says_what_caused_it():
    assert start_reason(False, False, False, {"trial"}) == "first start of a shape"
    assert start_reason(True, True, False, {"trial"}) == "again: its last group died"
    closed = start_reason(True, False, True, {"calibrate"})
    assert closed == (
        "again for the calibration: closed while idle, to free resources for another shape"
    )
    assert start_reason(True, False, False, {"trial", "calibrate"}).startswith("again for more")
