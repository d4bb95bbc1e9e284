"""A calibration measured by an earlier sweep on the same cluster shape, reused by later ones.

Why: the interconnect and the peaks a calibration measures belong to the cluster, not to the
sweep, and measuring them costs every sweep seconds to minutes (6.5 s of a one-trial sweep's
34 s on a 2-core laptop). Each fresh measurement is kept under
`<runs dir>/.calibrations/<key>.json`, keyed by what it depends on (`shape_key`): the backend,
the calibrating launch's workers and their resources, the cluster's nodes (host, CPUs, GPUs,
accelerator type), torch's version and the largest message measured. A later sweep in the same
runs directory whose key matches, within MAX_AGE_S of the measurement, writes it into its own
calibration.json with `reused_from` (the sweep that measured it, and when), and says so;
`platform sweep --recalibrate` measures again. A key that does not match, an old or unreadable
entry: measured again, never an error (docs/architecture.md, "Calibration in the group").
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amdahl.files import private_dir, write_private

#: Where the measurements are kept, inside the runs directory (beside the sweep directories).
CACHE_DIR = ".calibrations"
#: Oldest measurement reused: a day; a cluster's links and clocks change on that scale (driver
#: and firmware updates, other jobs), and a sweep a day measures again for seconds.
MAX_AGE_S = 24 * 3600.0
#: Bumped when what a calibration measures changes, so older entries stop matching.
FORMAT = 1


@dataclass(frozen=True)
class Reusable:
    """A stored measurement that matches: the workers' result (as
    worker.calibration_measurement.calibration_result returned it, `resources_per_worker` in
    it), the sweep directory that measured it and when (unix seconds)."""

    measurement: dict[str, Any]
    sweep_dir: str
    measured_at: float

    def age_s(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.measured_at

    def provenance(self) -> dict[str, Any]:
        """calibration.json's `reused_from`."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(self.measured_at))
        return {"sweep_dir": self.sweep_dir, "measured_at": stamp}


def cluster_nodes() -> list[dict[str, Any]]:
    """The live Ray cluster's nodes as the key sees them: host, CPUs, GPUs and accelerator
    type per alive node, sorted (node ids and addresses change with every `ray start`; the
    hardware behind them does not)."""
    import ray

    nodes = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        resources = node.get("Resources") or {}
        nodes.append(
            {
                "host": node.get("NodeManagerHostname", ""),
                "cpus": resources.get("CPU", 0.0),
                "gpus": resources.get("GPU", 0.0),
                "accelerators": sorted(k for k in resources if k.startswith("accelerator_type:")),
            }
        )
    return sorted(nodes, key=lambda n: json.dumps(n, sort_keys=True))


def shape_key(
    *,
    use_gpu: bool,
    workers: int,
    cpus_per_worker: float,
    gpus_per_worker: float,
    max_bytes: int,
    nodes: list[dict[str, Any]],
    torch_version: str,
) -> dict[str, Any]:
    """Everything a calibration's figures depend on; two sweeps with equal keys would measure
    the same thing."""
    return {
        "format": FORMAT,
        "backend": "nccl" if use_gpu else "gloo",
        "workers": workers,
        "cpus_per_worker": cpus_per_worker,
        "gpus_per_worker": gpus_per_worker,
        "max_bytes": max_bytes,
        "nodes": nodes,
        "torch": torch_version,
    }


def _entry(runs_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(runs_dir) / CACHE_DIR / f"{digest}.json"


def keep(runs_dir: Path, key: dict[str, Any], measurement: dict[str, Any], sweep_dir: Path) -> None:
    """Store a fresh measurement for later sweeps (owner-only, replaced whole)."""
    path = _entry(runs_dir, key)
    private_dir(path.parent, exist_ok=True)
    entry = {
        "key": key,
        "sweep_dir": str(Path(sweep_dir).resolve()),
        "measured_at": time.time(),
        "measurement": measurement,
    }
    write_private(path, json.dumps(entry, indent=1))


def find(
    runs_dir: Path, key: dict[str, Any], *, now: float | None = None, max_age_s: float = MAX_AGE_S
) -> Reusable | None:
    """The stored measurement for `key`, if one is younger than `max_age_s`; None otherwise
    (missing, stale, unreadable, or stored under a colliding digest for another key)."""
    try:
        entry = json.loads(_entry(runs_dir, key).read_text())
        if entry["key"] != key or not isinstance(entry["measurement"], dict):
            return None
        measurement = copy.deepcopy(entry["measurement"])
        found = Reusable(measurement, str(entry["sweep_dir"]), float(entry["measured_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    age = found.age_s(now)
    return found if 0 <= age <= max_age_s else None
