"""Measure the interconnect the report's alpha-beta model needs, and a peak FLOP/s for MFU.

Worker side (`calibration_worker`, inside a Ray Train worker group): all-reduce latency and bus
bandwidth over a range of message sizes, on whatever torch.distributed backend Ray Train
initialised (gloo on CPU, NCCL on GPU); rank 0 also times a matmul alone for a measured peak.
Driver side (`run_calibration`): one `TorchTrainer` with `devices` workers, the ring model
t = 2(p-1) alpha + 2(p-1)/p * bytes / bandwidth fitted to the times (report.compute), the model's
gradient bytes when the sweep directory says which model, and `<sweep dir>/calibration.json`.

ray and torch are imported inside the functions, so `import amdahl.calibrate` stays cheap.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from amdahl.errors import UserError
from amdahl.report.compute import bus_bandwidth, fit_alpha_beta
from amdahl.report.inputs import CALIBRATION_FILE, PLAN_FILE, SPEC_FILE

#: Message sizes in bytes: 4 B to 16 MiB in steps of 4x.
DEFAULT_SIZES = [4**k for k in range(1, 13)]
#: The key rank 0 reports its measurements under (as JSON: one value, whatever Ray adds).
RESULT_KEY = "amdahl_calibration"
#: Each size is timed in _ROUNDS rounds of about _ROUND_S; the median round is kept, so a
#: descheduled worker in one round does not set the figure.
_ROUNDS = 5
_ROUND_S = 0.05
_MAX_ITERS = 100


# --------------------------------------------------------------------------- worker side


def calibration_worker(config: dict[str, Any]) -> None:
    """`train_loop_per_worker`: measure, then rank 0 reports everything as one JSON value."""
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.set_num_threads(config["threads"])
    result: dict[str, Any] = {
        "devices": world,
        "backend": dist.get_backend() if dist.is_initialized() else "none",
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch_threads": torch.get_num_threads(),
        "all_reduce": measure_all_reduce(config["sizes"], device),
    }
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        result.update(measure_peak(device))
    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        ray.train.report({})
        return
    # Train V2 keeps only checkpoint-attached metrics in Result.metrics: attach a small one
    # (it also leaves the raw measurements in the run's storage).
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, CALIBRATION_FILE).write_text(json.dumps(result))
        ray.train.report(
            {RESULT_KEY: json.dumps(result)},
            checkpoint=ray.train.Checkpoint.from_directory(tmp),
        )


def measure_all_reduce(sizes: list[int], device: Any) -> list[dict[str, float]]:
    """Seconds per all_reduce (sum, float32) per message size: per round, the slowest rank's
    mean over the round's calls; the median over rounds. Collective: every rank calls it."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    world = dist.get_world_size()
    out = []
    for nbytes in sizes:
        x = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(x)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        sync()
        probe = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(probe, op=dist.ReduceOp.MAX)  # every rank runs the same count
        iters = int(min(_MAX_ITERS, max(3, _ROUND_S / max(float(probe), 1e-6))))
        rounds = []
        for _ in range(_ROUNDS):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            sync()
            per_call = (time.perf_counter() - t0) / iters
            slowest = torch.tensor([per_call], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            rounds.append(float(slowest))
        seconds = statistics.median(rounds)
        out.append(
            {
                "bytes": float(x.numel() * 4),
                "seconds": seconds,
                "busbw_Bps": bus_bandwidth(world, x.numel() * 4, seconds) if world > 1 else 0.0,
                "iterations": iters * _ROUNDS,
                "spread": (max(rounds) - min(rounds)) / seconds,
            }
        )
    return out


def measure_peak(device: Any) -> dict[str, Any]:
    """Matmul FLOP/s on this device alone (fp32, and bf16), as the MFU denominator."""
    import torch

    cuda = device.type == "cuda"
    n = 4096 if cuda else 1024
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    peaks = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        torch.mm(a, b)
        sync()
        best = 0.0
        for _ in range(5):  # a peak: the best of five rounds of about 0.1 s
            iters, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 0.1 or iters < 2:
                torch.mm(a, b)
                iters += 1
            sync()
            best = max(best, 2.0 * n**3 * iters / (time.perf_counter() - t0))
        peaks[name] = best
    what = f"{device.type} {'GPU' if cuda else f'{torch.get_num_threads()} thread(s)'}"
    memory = torch.cuda.get_device_properties(device).total_memory if cuda else None
    return {
        "peak_flops": peaks,
        "peak_source": f"measured: {n}x{n} matmul on one worker alone ({what})",
        "device_memory_bytes": memory,
    }


# --------------------------------------------------------------------------- driver side


def run_calibration(
    devices: int,
    sweep_dir: str | Path,
    *,
    resources_per_worker: dict[str, float] | None = None,
    use_gpu: bool = False,
    sizes: list[int] | None = None,
    address: str | None = None,
) -> dict[str, Any]:
    """Measure on `devices` Ray Train workers and write `<sweep_dir>/calibration.json`.

    Uses the Ray already initialised in this process, else connects to `address`, else starts
    (and afterwards stops) a local Ray. Returns what was written.
    """
    if devices < 2:
        raise UserError(
            f"--devices {devices}: an all-reduce needs at least 2 workers to measure anything"
        )
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    resources = dict(resources_per_worker or {"CPU": 0.5})
    sizes = list(sizes or DEFAULT_SIZES)

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        trainer = TorchTrainer(
            calibration_worker,
            train_loop_config={
                "sizes": sizes,
                "threads": max(1, int(resources.get("CPU", 1))),
            },
            scaling_config=ScalingConfig(
                num_workers=devices, use_gpu=use_gpu, resources_per_worker=resources
            ),
            run_config=RunConfig(
                name=f"calibrate-{stamp}",
                storage_path=str((sweep_dir / "ray" / "calibrate").resolve()),
            ),
        )
        metrics = trainer.fit().metrics or {}
    finally:
        if started:
            ray.shutdown()
    if RESULT_KEY not in metrics:
        raise RuntimeError("calibration workers reported no measurements")
    result = json.loads(metrics[RESULT_KEY])
    result.update(_fit(result))
    result.update(_grad_bytes(sweep_dir))
    result["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result["resources_per_worker"] = resources
    path = sweep_dir / CALIBRATION_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    return result


def _fit(result: dict[str, Any]) -> dict[str, Any]:
    ms = result["all_reduce"]
    ab = fit_alpha_beta(result["devices"], [m["bytes"] for m in ms], [m["seconds"] for m in ms])
    return {"alpha_s": ab.alpha_s, "bandwidth_Bps": ab.bandwidth_Bps, "fit_rel_rmse": ab.rel_rmse}


def _grad_bytes(sweep_dir: Path) -> dict[str, Any]:
    """Gradient bytes (fp32) of every model the sweep trains, keyed by the results table's
    `params` JSON; nothing when the directory does not say which workload it is."""
    spec_path = sweep_dir / SPEC_FILE
    if not spec_path.exists():
        return {}
    from amdahl.workload import make_workload

    spec = yaml.safe_load(spec_path.read_text()) or {}
    name = spec.get("workload")
    if not name:
        return {}
    all_params = [make_workload(name, spec.get("params") or {}).params]
    plan_path = sweep_dir / PLAN_FILE
    if plan_path.exists():
        plan = json.loads(plan_path.read_text())
        all_params += [t["settings"]["params"] for t in plan.get("trials", [])]
    by_params: dict[str, float] = {}
    for params in all_params:
        key = json.dumps(params, sort_keys=True)
        if key not in by_params:
            model = make_workload(name, params).build_model()
            by_params[key] = float(
                sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
            )
    first = json.dumps(all_params[0], sort_keys=True)
    return {"grad_bytes": by_params[first], "grad_bytes_by_params": by_params}


def summary(result: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    lines = [
        f"all-reduce on {result['devices']} workers ({result['backend']}, "
        f"{result['device_name']}): alpha = {result['alpha_s'] * 1e6:,.1f} us, "
        f"bandwidth = {result['bandwidth_Bps'] / 1e9:.3f} GB/s "
        f"(fit RMS relative error {result['fit_rel_rmse']:.0%})",
    ]
    for m in result["all_reduce"]:
        lines.append(
            f"  {m['bytes']:>12,.0f} B  {m['seconds'] * 1e6:>12,.1f} us  "
            f"bus {m['busbw_Bps'] / 1e9:8.3f} GB/s"
        )
    for kind, flops in (result.get("peak_flops") or {}).items():
        lines.append(f"peak {kind}: {flops / 1e9:,.1f} GFLOP/s ({result.get('peak_source', '')})")
    if result.get("grad_bytes"):
        lines.append(f"gradient bytes of the sweep's model: {result['grad_bytes']:,.0f}")
    return "\n".join(lines)
