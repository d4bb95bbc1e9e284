"""Hand-built results rows for the report tests (conformed to results.SCHEMA, so every column
the tests leave out is null, as in an old or partial table)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from amdahl.columns import COLUMNS, SCHEMA
from amdahl.sweepdir.layout import RESULTS_FILE

PARAMS = json.dumps({"hidden": [16]}, sort_keys=True)
#: The step-time model tests' gloo link (20 us, 1 GB/s) and gradient: 4 MB of PARAMS's, four
#: DDP buckets at 1 MiB, one at the default 25.
ALPHA, BANDWIDTH, GRAD = 20e-6, 1e9, 4e6
#: calibration.json of that link, measured at 2 devices.
CALIBRATION = {
    "alpha_s": ALPHA,
    "bandwidth_Bps": BANDWIDTH,
    "devices": 2,
    "backend": "gloo",
    "grad_bytes_by_params": {PARAMS: GRAD},
}


def row(
    devices: int = 1,
    batch: int = 128,
    sync: str = "ddp",
    throughput: float = 1000.0,
    *,
    repeat: int = 0,
    steps: int = 10,
    phases: tuple[float, float, float, float] | None = None,
    wall: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One ok row. `phases` = (data_wait, forward, backward, optimizer) seconds per step;
    `wall` = seconds per step of the measured window (default: global batch / throughput)."""
    global_batch = batch * devices
    step_wall = wall if wall is not None else global_batch / throughput
    r: dict[str, Any] = {
        "sweep": "t",
        "trial_id": f"d{devices}b{batch}{sync}",
        "repeat": repeat,
        "workload": "mlp",
        "params": PARAMS,
        "devices": devices,
        "batch_size": batch,
        "global_batch": global_batch,
        "micro_steps": 1,
        "precision": "fp32",
        "compile": "eager",
        "data_workers": 1,
        "sync": sync,
        "scaling": "weak",
        "status": "ok",
        "throughput": throughput,
        "steps": steps,
        "measured_s": step_wall * steps,
        "device_name": "cpu",
    }
    if phases is not None:
        d, f, b, o = phases
        r.update(data_wait_s=d, forward_s=f, backward_s=b, optimizer_s=o, step_time_s=f + b + o)
    r.update(extra)
    return r


def conform(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Through the real schema and back: absent columns become None."""
    table = pa.Table.from_pylist([{k: r.get(k) for k in COLUMNS} for r in rows], schema=SCHEMA)
    return table.to_pylist()


def write_sweep(
    path: Path,
    rows: list[dict[str, Any]],
    calibration: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([{k: r.get(k) for k in COLUMNS} for r in rows], schema=SCHEMA)
    pq.write_table(table, path / RESULTS_FILE)
    if calibration is not None:
        (path / "calibration.json").write_text(json.dumps(calibration))
    if spec is not None:
        (path / "spec.yaml").write_text(yaml.safe_dump(spec))
    return path


def scaling_rows() -> list[dict[str, Any]]:
    """A weak-scaling sweep: ddp and its sync-none ceiling at 1, 2 and 4 devices."""
    return [
        row(1, sync="ddp", throughput=1000.0, phases=(0.001, 0.04, 0.08, 0.007)),
        row(2, sync="ddp", throughput=1600.0, phases=(0.001, 0.04, 0.11, 0.007)),
        row(4, sync="ddp", throughput=2000.0, phases=(0.001, 0.04, 0.18, 0.007)),
        row(1, sync="none", throughput=1000.0, phases=(0.001, 0.04, 0.08, 0.007)),
        row(2, sync="none", throughput=1800.0, phases=(0.001, 0.05, 0.085, 0.007)),
        row(4, sync="none", throughput=3000.0, phases=(0.001, 0.06, 0.095, 0.008)),
    ]
