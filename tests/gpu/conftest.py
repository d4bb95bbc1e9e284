"""The GPU suite: skipped without CUDA (CI has none), run first on any machine that has one:

    pytest tests/gpu

It proves the CUDA and NCCL branches that CPU tests cannot reach: CUDA-event timing and the
device-timeline attribution, the side-stream input copy, TF32 flags, GPU memory counters,
NCCL process groups, bf16 gradient compression, and out-of-memory and sticky-error handling.
"""

import pytest
import torch

_NO_CUDA = pytest.mark.skip(reason="needs CUDA: the GPU suite runs where a GPU is")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(_NO_CUDA)


@pytest.fixture(scope="session")
def cuda():
    from trial_runner import one_rank_group

    torch.cuda.set_device(0)
    one_rank_group("nccl")
    return torch.device("cuda", 0)
