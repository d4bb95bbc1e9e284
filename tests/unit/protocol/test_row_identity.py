"""A failed row's status (protocol/identity.py)."""

import pytest

from amdahl.protocol.identity import failure_status


@pytest.mark.parametrize(
    "reason, status",
    [
        ("oom: CUDA out of memory", "oom"),
        (
            "launch failed: amdahl.worker.harness.RankStranded: oom: rank 1: CUDA out of memory",
            "oom",
        ),
        (
            "launch failed: rank 1: amdahl.worker.harness.RankStranded: oom: rank 1: CUDA out of",
            "oom",
        ),
        ("launch failed: ProcessPoisoned: failed: AcceleratorError: illegal memory", "failed"),
        ("failed: ValueError: oom: is not a word here\nsecond line", "failed"),
    ],
)
def test_a_failed_rows_status_says_out_of_memory_when_a_rank_ran_out(reason, status):
    assert failure_status(reason) == status
