"""The identity of a results row: the columns that say which measurement a row is, built the
same for the rows a worker measures and the failed or skipped rows the driver records for it;
and a failure's status.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

from amdahl.columns import SETTING_COLUMNS
from amdahl.protocol.contract import LaunchConfig, TrialConfig
from amdahl.spec.schema import TargetSpec, options_column


def row_identity(
    launch: LaunchConfig, trial: TrialConfig, repeat: int, started_at: str | None = None
) -> dict[str, Any]:
    """The columns that say which measurement a row is (what was run, and how), the same in
    every row the worker measures and every failed row the driver records for it."""
    train = launch.train
    return {
        "sweep": launch.sweep,
        "trial_id": trial.trial_id,
        "repeat": repeat,
        "rung": launch.rung,
        "launch_id": launch.launch_id,
        "workload": launch.workload,
        "params": json.dumps(trial.settings.params, sort_keys=True),
        **{k: getattr(trial.settings, k) for k in SETTING_COLUMNS},
        "batch_size": trial.per_device_batch,
        "options": options_column(trial.settings.options),
        "compile_cache": trial.compile_cache,
        "predicted_peak_mem_bytes": trial.predicted_peak_mem_bytes,
        "scaling": train.scaling,
        "steps": train.steps,
        "target": target_label(train.target),
        "warmup_steps": train.warmup_steps,
        "started_at": started_at or datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
    }


def target_label(target: TargetSpec | None) -> str | None:
    """`train.target` as the results table shows it, e.g. `val_accuracy>=0.9`."""
    if target is None:
        return None
    op = "<=" if target.metric == "val_loss" else ">="
    return f"{target.metric}{op}{target.value:g}"


_OOM_REASON = re.compile(r"(launch failed: (rank \d+: )?\S*RankStranded: )?oom: ")


def failure_status(reason: str) -> str:
    """The status of a row whose trial failed with `reason`: `oom` when a rank ran out of
    memory (also when it reached the driver as a stopped worker group's last error line,
    e.g. `launch failed: RankStranded: oom: rank 1: ...`, or with the rank whose error it is
    first: `launch failed: rank 1: ...RankStranded: oom: ...`), else `failed`."""
    return "oom" if _OOM_REASON.match(reason) else "failed"
