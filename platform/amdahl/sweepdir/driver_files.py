"""What the driver keeps in a sweep directory besides the results: the files it writes before
the first trial (`write_sweep_files`: spec.yaml, plan.json as `plan_summary` gives it,
fingerprint.json), and where Ray keeps the sweep's state (`ray_storage`).

A resume compares with spec.yaml and fingerprint.json, the report reads plan.json, and
`platform plan --json` prints the same summary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from amdahl.files import write_private
from amdahl.plan.trials import shown_settings
from amdahl.sweepdir.layout import SweepDir
from amdahl.sweepdir.resume import write_fingerprint

if TYPE_CHECKING:
    from amdahl.plan.launches import SweepPlan
    from amdahl.plan.trials import Trial
    from amdahl.spec.schema import SweepSpec


def write_sweep_files(sweep_dir: Path, spec: SweepSpec, plan: SweepPlan) -> None:
    """spec.yaml (the spec as given: a resume compares with it), plan.json, fingerprint.json."""
    d = SweepDir(sweep_dir)
    write_private(d.spec, yaml.safe_dump(spec.model_dump(), sort_keys=False))
    write_private(d.plan, json.dumps(plan_summary(plan), indent=1))
    write_fingerprint(d.path, spec)


def plan_summary(plan: SweepPlan) -> dict[str, Any]:
    """The plan as plain data (written to plan.json, shown by `platform plan --json`)."""

    def trial(t: Trial) -> dict[str, Any]:
        return {
            "trial_id": t.trial_id,
            "label": plan.labels[t.trial_id],
            "settings": shown_settings(t.settings),
            "resources": t.resources.describe(),
            "predicted_peak_mem_bytes": t.predicted_peak_mem_bytes,
            "largest_batch_fits": t.largest_batch_fits,
            "refused": t.refused,
        }

    return {
        "nodes": [vars(n) for n in plan.nodes],
        "resources": plan.spec.resources.model_dump(),
        "resource_note": plan.resource_note,
        "device_memory_gb": plan.device_memory_gb,
        "trials": [trial(t) for t in plan.trials],
        "memory_facts": [
            {"params": params, "precision": precision, "facts": facts.as_dict()}
            for params, precision, facts in plan.memory_facts
        ],
        "launches": [
            {"launch_id": launch.launch_id, "trials": [t.trial_id for t in launch.trials]}
            for launch in plan.launches()
        ],
    }


def ray_storage(spec: SweepSpec, sweep_dir: Path, *sub: str) -> str:
    """Where Ray Tune and Train keep this sweep's state: `<storage>/<sweep dir name>/...` when
    the spec names shared storage (one folder per sweep, so sweeps never collide), else
    `<sweep dir>/ray/...` on each node's own disk (enough: a launch writes no Train checkpoint
    that another node would have to read back)."""
    if spec.storage is None:
        return str(Path(SweepDir(sweep_dir).ray_dir, *sub).resolve())
    return "/".join([spec.storage.rstrip("/"), Path(sweep_dir).name, *sub])
