"""The parts of a trial around its loop: failure classes and per-trial caches."""

import os

import pytest
import torch

from amdahl.worker.peak import precision_dtype
from amdahl.worker.training import Precision, compile_caches, failure_kind, tf32_flags


@pytest.mark.parametrize(
    "error, kind",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"), "oom"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 1 TB"), "oom"),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "poisoned"),
        (RuntimeError("CUDA error: device-side assert triggered"), "poisoned"),
        (
            RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"),
            "poisoned",
        ),
        (RuntimeError("[Rank 0] Watchdog caught collective operation timeout"), "poisoned"),
        (ValueError("expected mat1 and mat2 to have the same dtype"), "failed"),
    ],
)
def test_failures_are_classified_by_what_they_leave_behind(error, kind):
    assert failure_kind(error) == kind


def test_a_torch_accelerator_error_is_poisoned_whatever_its_text():
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is None:
        pytest.skip("this torch has no AcceleratorError")
    assert failure_kind(accelerator_error("unknown error")) == "poisoned"


def test_cold_compile_caches_are_fresh_per_trial_and_removed_after():
    import torch._inductor.utils  # noqa: F401 - may set its default cache dir on import

    outside = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with compile_caches(cold=True):
        first = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert os.path.isdir(first) and not os.listdir(first)
        assert os.environ["TRITON_CACHE_DIR"].startswith(first)
    with compile_caches(cold=True):
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] != first
    assert not os.path.exists(first)
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == outside
    with compile_caches(cold=False):
        assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == outside


def test_tf32_flags_hold_inside_and_come_back_after_an_error():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with pytest.raises(RuntimeError):
        with tf32_flags(True):
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
            raise RuntimeError("trial failed")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


@pytest.mark.parametrize("name", ["fp32", "tf32", "bf16", "fp16", "bf16_weights"])
def test_a_precisions_matmuls_run_in_the_dtype_its_peak_is_measured_in(name):
    """The loop's own path (weights cast, input cast, autocast) on a real Linear layer: the
    dtype the layer computes in is `compute_dtype`, and it is the dtype the peak-FLOP/s probe
    times for that precision (MFU divides one by the other)."""
    precision, cpu = Precision.of(name), torch.device("cpu")
    layer = torch.nn.Linear(3, 4)
    if precision.weights_dtype is not None:
        layer = layer.to(precision.weights_dtype)
    with precision.autocast(cpu):
        out = layer(precision.cast_input(torch.ones(2, 3)))
    assert out.dtype == precision.compute_dtype == precision_dtype(name)


def test_precision_casts_and_scales_as_its_name_says():
    x = torch.ones(2, 3)
    assert Precision.of("bf16_weights").cast_input(x).dtype == torch.bfloat16
    assert Precision.of("bf16").cast_input(x).dtype == torch.float32  # autocast, not a cast
    assert Precision.of("fp16").scaler(torch.device("cpu")) is not None
    assert Precision.of("fp32").scaler(torch.device("cpu")) is None
    ids = torch.ones(2, dtype=torch.int64)
    assert Precision.of("bf16_weights").cast_input(ids).dtype == torch.int64
