"""The calibration's all-reduce measurement on a GPU (worker/calibration_measurement.py): NCCL
over one rank, timed with the device synchronised, with the host's CPU seconds beside."""

import os

from amdahl.worker.calibration_measurement import measure_all_reduce


def test_the_all_reduce_is_timed_on_nccl_with_the_hosts_cpu_beside(cuda):
    measured = measure_all_reduce([1024, 64 << 20], cuda)
    assert [m["bytes"] for m in measured] == [1024.0, float(64 << 20)]
    cores = os.cpu_count() or 1
    for m in measured:
        # the host's CPU seconds per call (launching, waiting in the synchronize): recorded,
        # and no more than the call's wall time on every core (medians: some slack)
        assert m["seconds"] > 0 and 0 < m["cpu_seconds"] <= 1.5 * cores * m["seconds"], m
