"""The one peak-FLOP/s probe: the MFU denominator, for the harness (per trial) and for
`platform calibrate` (into calibration.json), so both report the same figure.

A measured peak, not a datasheet figure: on CPU there is no honest datasheet peak for the
threads a worker was given, on GPU the datasheet's tensor-core figure assumes clocks, shapes and
sparsity a training step never sees, and a measured peak is what this worker's matmuls can reach
in the trial's own number format. MFU against it reads as "how close the model gets to a square
matmul on the same device", which is comparable across configurations and stays at or below 100%
unless the model's FLOPs per sample overstate its work.

Worker side: imports torch, never ray.
"""

from __future__ import annotations

import time

import torch

#: The sweep's precisions (spec.Precision) and the matmul each one's peak is measured with:
#: (dtype, TF32 tensor-core mode for float32 matmuls).
PRECISION_MATMUL: dict[str, tuple[torch.dtype, bool]] = {
    "fp32": (torch.float32, False),
    "tf32": (torch.float32, True),
    "bf16": (torch.bfloat16, False),
    "bf16_weights": (torch.bfloat16, False),
    "fp16": (torch.float16, False),
}
#: Warm-up matmuls before timing (kernel selection, clocks ramping up, allocator).
WARMUP = 3
#: Shortest timed window, seconds.
MIN_SECONDS = 0.2

_CACHE: dict[tuple, float] = {}


def precision_dtype(precision: str) -> torch.dtype:
    """The dtype a precision's matmuls run in (tf32: float32 with TF32 tensor cores)."""
    return _matmul(precision)[0]


def matrix_size(device: torch.device) -> int:
    """Side n of the square matrices timed: 8192 on CUDA, 512 on CPU.

    The device is synchronised after every few matmuls, and that wait must not count against the
    peak, so each matmul has to be long next to a synchronisation: at 8192^2 one takes about a
    millisecond even on an H100 (fp32 and bf16 alike), where a smaller one would leave the GPU
    idle between launches and measure the launch rate. On CPU the call is synchronous and 512^2
    already keeps every thread busy for milliseconds in fp32, while a larger matrix would make
    the slow bf16/fp16 CPU kernels take seconds per call.
    """
    return 8192 if device.type == "cuda" else 512


def measure_peak_flops(device: torch.device, precision: str) -> float:
    """Matmul FLOP/s of this worker alone in `precision`'s number format (cached per process).

    precision is one of the sweep's: fp32 (float32, TF32 off), tf32 (float32 with
    `torch.backends.cuda.matmul.allow_tf32` on; on CPU the same as fp32), bf16 and bf16_weights
    (bfloat16), fp16 (float16). The TF32 flag is set for the probe and restored afterwards.
    Timing: WARMUP matmuls, then wall-clock time over at least MIN_SECONDS with the device
    synchronised before the clock is read; each n x n matmul counts 2 n^3 FLOPs. The matrices
    are freed before returning (and on CUDA the cached blocks released), so the probe leaves no
    memory behind.
    """
    dtype, tf32 = _matmul(precision)
    device = torch.device(device)
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    tf32 = tf32 and cuda  # TF32 is a CUDA tensor-core mode; on CPU tf32 is plain fp32
    # CPU matmul speed depends on the threads this worker was given: part of the key.
    key = (str(device), dtype, tf32, None if cuda else torch.get_num_threads())
    if key not in _CACHE:
        _CACHE[key] = _time_matmuls(device, dtype, tf32)
    return _CACHE[key]


def _matmul(precision: str) -> tuple[torch.dtype, bool]:
    try:
        return PRECISION_MATMUL[precision]
    except KeyError:
        known = ", ".join(PRECISION_MATMUL)
        raise ValueError(f"unknown precision {precision!r}; one of {known}") from None


def _time_matmuls(device: torch.device, dtype: torch.dtype, tf32: bool) -> float:
    cuda = device.type == "cuda"
    n = matrix_size(device)
    per_sync = 4 if cuda else 1  # CPU calls are synchronous: nothing to amortise

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    previous = torch.backends.cuda.matmul.allow_tf32
    a = b = c = None
    try:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        c = torch.empty(n, n, device=device, dtype=dtype)
        for _ in range(WARMUP):
            torch.mm(a, b, out=c)
        sync()
        reps, start = 0, time.perf_counter()
        while True:
            for _ in range(per_sync):
                torch.mm(a, b, out=c)
            reps += per_sync
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= MIN_SECONDS:
                return 2.0 * n**3 * reps / elapsed
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
        del a, b, c
        if cuda:
            torch.cuda.empty_cache()
