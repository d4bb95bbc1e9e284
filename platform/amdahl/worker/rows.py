"""The results row a worker group measures for one trial repeat: its identity
(protocol.identity.row_identity) and where it ran, then the first rank's failure or the
ranks' measurements aggregated into the results table's columns (amdahl.columns). Built on
rank 0 (worker/harness.py), which acknowledges the work item with it.
"""

from __future__ import annotations

import json
import math
import platform as _stdlib_platform
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from amdahl.protocol.contract import LaunchConfig, TrialConfig
from amdahl.protocol.identity import failure_status, row_identity
from amdahl.worker.flops import flops_figures
from amdahl.worker.tensor_ledger import BREAKDOWN_COLUMNS
from amdahl.worker.training import process_versions
from amdahl.worker.utilisation import allowed_cores, utilisation_columns


def results_row(
    launch: LaunchConfig,
    trial: TrialConfig,
    repeat: int,
    ranks: list[dict],
    started: float,
    stamp: str,
    device: torch.device,
) -> dict[str, Any]:
    """One trial repeat's results row from every rank's (stats, error) (`_gather`): its identity
    and where it ran, then the first rank's failure or the ranks' aggregated measurements."""
    errors = [r["error"] for r in ranks if r["error"]]
    row: dict[str, Any] = {
        **row_identity(launch, trial, repeat, started_at=stamp),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "backend": dist.get_backend() if dist.is_initialized() else "none",
        "torch_threads": launch.resources.torch_threads,
        "host": _stdlib_platform.node(),
        "versions": json.dumps(process_versions()),
        "nodes": json.dumps([r.get("node") for r in ranks]),
    }
    if errors:
        first = errors[0]
        row["status"] = failure_status(first)
        row["error"] = first
    else:
        row.update(aggregate_ranks([r["stats"] for r in ranks], trial, launch))
    row["wall_s"] = time.perf_counter() - started
    return row


def aggregate_ranks(
    stats: list[dict[str, Any]], trial: TrialConfig, launch: LaunchConfig
) -> dict[str, Any]:
    """Per-rank measurements -> one row: throughput over all ranks, median and max per phase;
    the per-step curves (`history`) are rank 0's."""
    med = lambda k: statistics.median(r[k] for r in stats)  # noqa: E731
    top = lambda k: max(r[k] for r in stats)  # noqa: E731
    micro = stats[0]["micro_steps"]
    global_batch = trial.per_device_batch * len(stats) * micro
    window = top("window_s")
    measured_steps = stats[0]["measured_steps"]
    throughput = global_batch * measured_steps / window
    figures = flops_figures(
        stats[0].get("flops_counted"), trial.flops_per_sample, trial.flops_override
    )
    flops = figures["flops_per_sample"]
    losses = [r["final_loss"] for r in stats]
    diverged = not all(math.isfinite(v) for v in losses)
    return {
        "status": "diverged" if diverged else "ok",
        "error": "non-finite training loss" if diverged else None,
        "global_batch": global_batch,
        "micro_steps": micro,
        "steps": measured_steps,
        "lr": stats[0]["lr"],
        "steps_to_target": stats[0]["steps_to_target"],
        "time_to_target_s": top("time_to_target_s") if stats[0]["steps_to_target"] else None,
        "throughput": throughput,
        "measured_s": window,
        "item_measured_s": top("item_window_s"),
        "step_time_s": top("step_time_s"),
        "step_time_max_s": top("step_time_max_s"),
        "data_wait_s": med("data_wait_s"),
        "data_wait_max_s": top("data_wait_s"),
        "data_wait_host_s": med("data_wait_host_s"),
        "transfer_s": med("transfer_s") if stats[0]["transfer_s"] is not None else None,
        "forward_s": med("forward_s"),
        "backward_s": med("backward_s"),
        "optimizer_s": med("optimizer_s"),
        "warmup_s": top("warmup_s"),
        "first_step_s": top("first_step_s"),
        "compile_s": top("compile_s"),
        "setup_s": top("setup_s"),
        "window_opened_unix": stats[0]["window_opened_unix"],
        "comm_probe_s": top("comm_probe_s") if stats[0]["comm_probe_s"] is not None else None,
        "validation_s": top("validation_s") if stats[0]["validation_s"] is not None else None,
        "final_loss": statistics.fmean(losses),
        "val_loss": stats[0]["val_loss"],
        "val_accuracy": stats[0]["val_accuracy"],
        **_memory(stats),
        "model_state_bytes": top("model_state_bytes"),
        **figures,
        "flops_count_s": stats[0].get("flops_count_s"),
        "achieved_flops": throughput * flops if flops else None,
        "comm_s": med("comm_s") if stats[0]["comm_s"] is not None else None,
        "profile_s": top("profile_s") if stats[0].get("profile_s") is not None else None,
        "peak_flops": med("peak_flops"),
        "mfu": throughput * flops / (med("peak_flops") * len(stats)) if flops else None,
        "hfu": _hfu(figures, throughput, med("peak_flops") * len(stats)),
        "windows": stats[0].get("windows"),
        "continued_from": stats[0].get("continued_from"),
        "restart_reason": stats[0].get("restart_reason"),
        # the trial's own: "own" where it reloaded its configuration's graphs (compile_dirs)
        **({"compile_cache": "own"} if stats[0].get("compile_cache") == "own" else {}),
        "history": json.dumps(stats[0]["history"], separators=(",", ":")),  # rank 0's curves
        **utilisation_columns([r.get("utilisation") for r in stats]),
        "host_cores": allowed_cores(),
    }


def _memory(stats: list[dict[str, Any]]) -> dict[str, float | None]:
    """The memory columns over ranks: each peak the largest any rank reached, and the
    tensor-byte breakdown that rank's (so its parts add up to its peak); null where no rank
    measured one (an inductor trial's tensor bytes on CPU)."""
    peak = lambda k: max((r[k] for r in stats if r.get(k) is not None), default=None)  # noqa: E731
    measured = [r for r in stats if r.get("peak_mem_bytes") is not None]
    widest = max(measured, key=lambda r: r["peak_mem_bytes"]) if measured else {}
    return {
        "peak_mem_bytes": peak("peak_mem_bytes"),
        "peak_mem_reserved_bytes": peak("peak_mem_reserved_bytes"),
        "peak_rss_bytes": peak("peak_rss_bytes"),
        **{k: widest.get(k) for k in BREAKDOWN_COLUMNS},
    }


def _hfu(figures: dict[str, Any], throughput: float, peak: float) -> float | None:
    """Hardware FLOPs utilisation (PaLM, appendix B): the counted FLOPs with the fused attention
    backward's recomputation; only where MFU uses the counted figure and the two differ."""
    hardware, model = figures["flops_hardware"], figures["flops_counted"]
    if figures["flops_source"] != "counted" or not hardware or hardware <= model or peak <= 0:
        return None
    return throughput * hardware / peak
