"""Measure the interconnect the report's alpha-beta model needs, and a peak FLOP/s for MFU: the
driver side of `platform calibrate`.

The workers (worker/calibration_measurement.py, `calibration_worker`) time the all-reduce over
a range of message sizes on whatever torch.distributed backend Ray Train initialised (gloo on
CPU, NCCL on GPU), and rank 0 a peak per precision with the probe the harness uses.
Here (`run_calibration`): the sweep's workload checked first (an import error costs no
measurement), one `TorchTrainer` with `devices` workers, the ring model
t = 2(p-1) alpha + 2(p-1)/p * bytes / bandwidth fitted to the times (analysis.alphabeta),
`<sweep dir>/calibration.json` written as soon as that is known, then rewritten with the model's
gradient bytes when the sweep directory says which model.

Ray, torch and the worker side are imported inside the functions, so
`import amdahl.driver.calibrate` stays cheap.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from amdahl.analysis.alphabeta import bus_bandwidth, fit_alpha_beta
from amdahl.driver.cluster import connect_ray
from amdahl.errors import UserError
from amdahl.files import private_dir, write_private
from amdahl.protocol.items import message_sizes
from amdahl.sweepdir.layout import STAMP_FORMAT, SweepDir

#: Largest message on CPU (gloo): enough for its bandwidth, small enough for a quick CI run.
CPU_MAX_BYTES = 16 * 2**20
#: Largest message on GPU (NCCL): past the gradients the sweeps all-reduce (sweeps/scaling.yaml's
#: model has 143 MB of them), well inside the sizes where NCCL runs its bulk protocol and the
#: time is bytes over the link's bandwidth.
GPU_MAX_BYTES = 512 * 2**20


def run_calibration(
    devices: int,
    sweep_dir: str | Path,
    *,
    resources_per_worker: dict[str, float] | None = None,
    use_gpu: bool = False,
    sizes: list[int] | None = None,
    max_bytes: int | None = None,
    address: str | None = None,
) -> dict[str, Any]:
    """Measure on `devices` Ray Train workers and write `<sweep_dir>/calibration.json`.

    Message sizes: `sizes`, else 4 B to `max_bytes` (default GPU_MAX_BYTES with `use_gpu`, else
    CPU_MAX_BYTES). The sweep's workload and parameter sets are checked before anything is
    measured; the measurement is written as soon as it is fitted, and the file rewritten with
    the gradient bytes after, so a model that fails to build loses no measurement.

    Uses the Ray already initialised in this process, else connects to `address`, else starts
    (and afterwards stops) a local Ray of its own sized to this machine, never joining one it
    happens to find (cluster.connect_ray, as the sweep driver does); Ray's log lines go to the
    sweep directory's ray.log. Returns what was written.
    """
    if devices < 2:
        raise UserError(
            f"--devices {devices}: an all-reduce needs at least 2 workers to measure anything"
        )
    sweep_dir = Path(sweep_dir)
    resources = dict(resources_per_worker or {"CPU": 0.5})
    if not sizes:
        sizes = message_sizes(max_bytes or (GPU_MAX_BYTES if use_gpu else CPU_MAX_BYTES))
    models = _sweep_models(sweep_dir)  # before measuring: a bad workload costs nothing
    private_dir(sweep_dir, exist_ok=True)

    import ray

    from amdahl.protocol.queue import CALIBRATION_RESULT_KEY
    from amdahl.worker.calibration_measurement import calibration_worker

    started = connect_ray(address, SweepDir(sweep_dir).ray_log)  # sets ray.train's env first
    try:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        stamp = datetime.now(timezone.utc).strftime(STAMP_FORMAT)
        trainer = TorchTrainer(
            calibration_worker,
            train_loop_config={
                "sizes": list(sizes),
                "threads": max(1, int(resources.get("CPU", 1))),
            },
            scaling_config=ScalingConfig(
                num_workers=devices, use_gpu=use_gpu, resources_per_worker=resources
            ),
            run_config=RunConfig(
                name=f"calibrate-{stamp}",
                storage_path=str((SweepDir(sweep_dir).ray_dir / "calibrate").resolve()),
            ),
        )
        metrics = trainer.fit().metrics or {}
    finally:
        if started:
            ray.shutdown()
    if CALIBRATION_RESULT_KEY not in metrics:
        raise RuntimeError("calibration workers reported no measurements")
    return finish_calibration(
        sweep_dir, json.loads(metrics[CALIBRATION_RESULT_KEY]), resources, models
    )


def finish_calibration(
    sweep_dir: Path,
    result: dict[str, Any],
    resources: dict[str, float],
    models: dict[str, Any] | None = None,
    reused_from: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A measurement (worker.calibration_measurement.calibration_result, from `platform
    calibrate`'s own worker group or a sweep's live launch) fitted and written to
    calibration.json at once, then again with the gradient bytes of the sweep's models (so a
    model that fails to build loses no measurement). `reused_from`: where an earlier sweep
    measured it (driver/calibration_reuse.py), kept in the file. Returns what was written."""
    world = result["devices"]
    for m in result["all_reduce"]:
        m["busbw_Bps"] = bus_bandwidth(world, m["bytes"], m["seconds"]) if world > 1 else 0.0
    result.update(_fit(result))
    result["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result["resources_per_worker"] = resources
    if reused_from is not None:
        result["reused_from"] = reused_from
    path = write_calibration(sweep_dir, result)
    models = _sweep_models(sweep_dir) if models is None else models
    if models:
        try:
            result.update(_grad_bytes_of(models))
        except Exception as e:
            raise RuntimeError(
                f"the measurement is in {path}, but building the sweep's models for their "
                f"gradient bytes failed: {e}"
            ) from e
        write_calibration(sweep_dir, result)
    return result


def write_calibration(sweep_dir: Path, result: dict[str, Any]) -> Path:
    """calibration.json, replaced whole (a reader never sees half a file), owner-only."""
    return write_private(SweepDir(sweep_dir).calibration, json.dumps(result, indent=1))


def _fit(result: dict[str, Any]) -> dict[str, Any]:
    """alpha and B at the group's device count, and at each device count measured over a
    subgroup (`by_devices`, where the measurement has them; a count whose times do not fit is
    left out of it, the rest kept)."""
    ms = result["all_reduce"]
    ab = fit_alpha_beta(result["devices"], [m["bytes"] for m in ms], [m["seconds"] for m in ms])
    out = {"alpha_s": ab.alpha_s, "bandwidth_Bps": ab.bandwidth_Bps, "fit_rel_rmse": ab.rel_rmse}
    by_devices = {}
    for q, sub in (result.get("all_reduce_by_devices") or {}).items():
        try:
            fit = fit_alpha_beta(int(q), [m["bytes"] for m in sub], [m["seconds"] for m in sub])
        except ValueError:
            continue
        by_devices[str(q)] = {
            "alpha_s": fit.alpha_s,
            "bandwidth_Bps": fit.bandwidth_Bps,
            "fit_rel_rmse": fit.rel_rmse,
        }
    if by_devices:
        out["by_devices"] = by_devices
    return out


def _sweep_models(sweep_dir: Path) -> dict[str, Any]:
    """Every model the sweep trains, as workload instances keyed by the results table's
    `params` JSON (the spec's own first); {} when the directory does not say which workload.
    Instantiating imports the workload and checks each parameter set (UserError), without
    building a model."""
    spec_path, plan_path = SweepDir(sweep_dir).spec, SweepDir(sweep_dir).plan
    if not spec_path.exists():
        return {}
    from amdahl.workload.code import make_workload

    spec = yaml.safe_load(spec_path.read_text()) or {}
    name = spec.get("workload")
    if not name:
        return {}
    first = make_workload(name, spec.get("params") or {})
    all_params = [first.params]
    if plan_path.exists():
        plan = json.loads(plan_path.read_text())
        all_params += [t["settings"]["params"] for t in plan.get("trials", [])]
    models: dict[str, Any] = {}
    for params in all_params:
        key = json.dumps(params, sort_keys=True)
        if key not in models:
            models[key] = first if not models else make_workload(name, params)
    return models


def _grad_bytes_of(models: dict[str, Any]) -> dict[str, Any]:
    """Gradient bytes (fp32) and trainable parameter shapes (the step-time model's PowerSGD
    factors) of each model; the first key is the spec's own model. Built on the meta device
    (shapes, no memory) where the workload allows, else for real."""
    import torch

    by_params: dict[str, float] = {}
    shapes: dict[str, list[list[int]]] = {}
    for key, workload in models.items():
        try:
            with torch.device("meta"):
                model = workload.build_model()
        except Exception:  # a workload that needs real tensors to build
            model = workload.build_model()
        trained = [p for p in model.parameters() if p.requires_grad]
        by_params[key] = float(sum(p.numel() * 4 for p in trained))
        shapes[key] = [list(p.shape) for p in trained]
        del model
    return {
        "grad_bytes": by_params[next(iter(models))],
        "grad_bytes_by_params": by_params,
        "param_shapes_by_params": shapes,
    }


def grad_bytes(sweep_dir: Path) -> dict[str, Any]:
    """Gradient bytes (fp32) of every model the sweep trains, keyed by the results table's
    `params` JSON; nothing when the directory does not say which workload it is."""
    models = _sweep_models(sweep_dir)
    return _grad_bytes_of(models) if models else {}


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
