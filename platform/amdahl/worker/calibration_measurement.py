"""The calibration measurement, on the workers: all-reduce seconds per message size over the
worker group's process group, and one worker's matmul peak per precision (the report's and the
step-time model's alpha-beta and MFU denominators).

An entry point of the worker side: `calibration_worker` is the `train_loop_per_worker` of
`platform calibrate`'s own worker group (driver/calibrate.py starts it); a sweep's live launch
runs `calibration_result` for a calibrate work item (worker/harness.py). torch and Ray are
imported inside the functions, as the driver imports this module to start the group.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from amdahl.protocol.queue import CALIBRATION_RESULT_KEY
from amdahl.worker.peak import matrix_size, measure_peak_flops

#: The file the measurement is written to in the checkpoint rank 0 reports it with.
_CHECKPOINT_FILE = "calibration.json"
#: Timed rounds per message size, each about _ROUND_S long (the calls per round re-read from
#: the first round), at most _MAX_ITERS calls. Below _LATENCY_BYTES (the sizes that set alpha,
#: not the bandwidth fit's) a round is _LATENCY_ROUND_S: still ~40 calls at gloo's ~0.5 ms.
#: `python benchmarks/calibration_cost.py` on the 2-core box (2 gloo ranks, interleaved
#: rounds): 0.25x the seconds of a reference three times as thorough, the same fitted alpha
#: (1.03, 0.89-1.12) and bandwidth (1.01, 0.96-1.07).
_ROUNDS = 5
_ROUND_S = 0.03
_MAX_ITERS = 100
_LATENCY_BYTES = 2**20
_LATENCY_ROUND_S = 0.02


def calibration_worker(config: dict[str, Any]) -> None:
    """`train_loop_per_worker` of `platform calibrate`'s worker group (`config`: the message
    `sizes` and the `threads` per worker): measure, then rank 0 reports everything as one JSON
    value under CALIBRATION_RESULT_KEY."""
    import ray.train
    import ray.train.torch
    import torch

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    device = ray.train.torch.get_device()
    torch.set_num_threads(config["threads"])
    result = calibration_result(config["sizes"], device, rank)
    if rank != 0:
        ray.train.report({})
        return
    # Train V2 keeps only checkpoint-attached metrics in Result.metrics: attach a small one
    # (it also leaves the raw measurements in the run's storage).
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, _CHECKPOINT_FILE).write_text(json.dumps(result))
        ray.train.report(
            {CALIBRATION_RESULT_KEY: json.dumps(result)},
            checkpoint=ray.train.Checkpoint.from_directory(tmp),
        )


def calibration_result(sizes: list[int], device: Any, rank: int) -> dict[str, Any]:
    """Every rank of the current process group measures the all-reduce, over the whole group
    and over its first q ranks for each smaller q of `sub_counts` (how the collective grows
    with the device count is measured, not assumed); rank 0 then measures the peaks alone.
    Collective. Rank 0's dict is the measurement (others' lack the peaks)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    result: dict[str, Any] = {
        "devices": world,
        "backend": dist.get_backend() if dist.is_initialized() else "none",
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch_threads": torch.get_num_threads(),
        "all_reduce": measure_all_reduce(sizes, device),
    }
    by_devices = {}
    for q in sub_counts(world)[:-1]:
        group = dist.new_group(list(range(q)))  # every rank of the world must call it
        if rank < q:
            by_devices[str(q)] = measure_all_reduce(sizes, device, group)
        dist.barrier()
        dist.destroy_process_group(group)  # a no-op on the ranks outside it
    if by_devices:
        result["all_reduce_by_devices"] = {**by_devices, str(world): result["all_reduce"]}
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        result.update(measure_peaks(device))
    if dist.is_initialized():
        dist.barrier()
    return result


def sub_counts(world: int) -> list[int]:
    """The device counts a calibration over `world` ranks measures, `world` last: every count
    from 2 up to 4, then the powers of two below `world` (2, 3, 4 of 4; 2, 3, 4, 8, 12 of 12)."""
    if world < 2:
        return [world]
    counts = {q for q in range(2, min(world, 4) + 1)} | {2**k for k in range(1, 8) if 2**k < world}
    return sorted(counts - {world}) + [world]


def measure_all_reduce(sizes: list[int], device: Any, group: Any = None) -> list[dict[str, float]]:
    """Seconds per all_reduce (sum, float32) per message size over `group` (default: the
    world): per round, the slowest rank's mean over the round's calls; the median over rounds.
    Beside it the ranks' mean CPU seconds per call (median over rounds). Collective: every rank
    of the group calls it."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = []
    for nbytes in sizes:
        x = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(x, group=group)
        sync()
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        sync()
        probe = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group)  # every rank runs the same count
        round_s = _LATENCY_ROUND_S if nbytes < _LATENCY_BYTES else _ROUND_S
        iters = _iterations(round_s, float(probe))
        rounds, cpu_rounds = [], []
        for r in range(_ROUNDS):
            if r == 1:  # one call alone ran faster than calls back to back: a round's mean is
                iters = _iterations(round_s, rounds[0])  # the same on every rank (the max)
            dist.barrier(group=group)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(iters):
                dist.all_reduce(x, group=group)
            sync()
            per_call = (time.perf_counter() - t0) / iters
            cpu_per_call = (time.process_time() - c0) / iters
            slowest = torch.tensor([per_call], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
            rounds.append(float(slowest))
            cpu = torch.tensor([cpu_per_call], dtype=torch.float64, device=device)
            dist.all_reduce(cpu, group=group)
            cpu_rounds.append(float(cpu) / dist.get_world_size(group))
        seconds = statistics.median(rounds)
        out.append(
            {
                "bytes": float(x.numel() * 4),
                "seconds": seconds,
                "iterations": iters * _ROUNDS,
                "spread": (max(rounds) - min(rounds)) / seconds,
                # a rank's CPU seconds per call, every thread of its process (gloo's transport
                # thread too), mean over the ranks: how much of the collective is host work
                "cpu_seconds": statistics.median(cpu_rounds),
            }
        )
    return out


def _iterations(round_s: float, per_call_s: float) -> int:
    """Calls in a round of about `round_s` at `per_call_s` each (3 to _MAX_ITERS)."""
    return int(min(_MAX_ITERS, max(3, round_s / max(per_call_s, 1e-6))))


def measure_peaks(device: Any) -> dict[str, Any]:
    """Matmul FLOP/s on this device alone per precision (fp32, tf32, bf16, and fp16 on CUDA),
    the MFU denominators: the same probe as the harness's per-trial peak (amdahl.worker.peak)."""
    import torch

    cuda = device.type == "cuda"
    kinds = ("fp32", "tf32", "bf16", "fp16") if cuda else ("fp32", "tf32", "bf16")
    peaks = {kind: measure_peak_flops(device, kind) for kind in kinds}
    n = matrix_size(device)
    what = f"{device.type} GPU" if cuda else f"cpu {torch.get_num_threads()} thread(s)"
    if not cuda:
        what += "; tf32 is fp32 there"
    memory = torch.cuda.get_device_properties(device).total_memory if cuda else None
    return {
        "peak_flops": peaks,
        "peak_source": f"measured: {n}x{n} matmul on one worker alone ({what})",
        "device_memory_bytes": memory,
    }
