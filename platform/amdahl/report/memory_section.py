"""The report's memory section: each configuration's measured peak tensor bytes per device, what
the plan predicted before it ran, and what holds the most.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
import statistics

from amdahl.analysis.configs import Config
from amdahl.analysis.memory_model import predict_peak
from amdahl.report.build import Report
from amdahl.report.document import Section, Table, mib
from amdahl.strategies import micro_steps

#: The breakdown columns (worker/tensor_ledger.py) and how the table names them.
PARTS = {
    "mem_parameters_bytes": "parameters",
    "mem_gradients_bytes": "gradients",
    "mem_optimizer_bytes": "optimizer state",
    "mem_activations_bytes": "activations",
    "mem_temporaries_bytes": "temporaries",
    "mem_other_bytes": "buffers (DDP's buckets, ...)",
}
#: An under-prediction by more than this share is an out-of-memory error waiting to happen.
UNDER_PREDICTION = 0.10


def memory_section(r: Report) -> Section:
    sec = Section("memory", "Memory per device")
    sec.paras.append(
        "Peak tensor bytes one device held in a training step (`peak_mem_bytes`: CUDA's "
        "allocated peak on a GPU; on CPU a tensor ledger over one step, the same quantity), "
        "beside the plan's prediction before the trial ran (`predicted_peak_mem_bytes`: "
        "analysis/memory_model.py over the workload's memory probe), and the largest part of "
        "the measured peak."
    )
    rows, errors = [], []
    for c in r.configs:
        measured, predicted = c.stat("peak_mem_bytes"), c.stat("predicted_peak_mem_bytes")
        if measured is None and predicted is None:
            continue
        error = None
        if measured and predicted and measured.median > 0:
            error = predicted.median / measured.median - 1
            errors.append((c.label, error))
        rows.append(
            [
                c.label,
                mib(measured.median) if measured else "n/a",
                mib(predicted.median) if predicted else "n/a",
                f"{error:+.1%}" if error is not None else "n/a",
                _largest_part(c),
            ]
        )
    if not rows:
        sec.paras.append("No trial measured or predicted its memory.")
        return sec
    header = ["configuration", "measured MiB", "predicted MiB", "error", "largest part"]
    sec.tables.append(Table(header, rows))
    if errors:
        absolute = [abs(e) for _, e in errors]
        sec.bullets.append(
            f"prediction error over {len(errors)} configurations: median "
            f"{statistics.median(absolute):.1%}, largest {max(absolute):.1%}"
        )
    sec.bullets += _savings(r)
    for label, error in errors:
        if error < -UNDER_PREDICTION:
            sec.bullets.append(
                f"{label}: predicted {-error:.0%} below what it held: a device sized by the "
                "prediction would run out of memory here"
            )
    return sec


#: How many configurations (the largest peaks first) the savings lines cover.
SAVINGS_SHOWN = 3


def _savings(r: Report) -> list[str]:
    """What another strategy or precision would hold at the same devices and batch, by the
    memory model over plan.json's probe facts, for the configurations that hold the most."""
    held = [(c, c.stat("predicted_peak_mem_bytes")) for c in r.configs]
    held = sorted(((c, s.median) for c, s in held if s), key=lambda x: -x[1])
    out = []
    for c, own in held[:SAVINGS_SHOWN]:
        s = c.settings
        params = json.dumps(json.loads(s["params"]), sort_keys=True)
        alternatives = []
        facts = r.memory_facts.get((params, s["precision"]))
        for sync in ("zero1", "fsdp") if facts and c.devices > 1 else ():
            if sync != s["sync"]:
                other = predict_peak(facts, sync, c.devices, c.batch_size, _micro(c, sync)).total
                alternatives.append((f"sync {sync}", other))
        bf16 = r.memory_facts.get((params, "bf16"))
        if bf16 and s["precision"] == "fp32":
            micro = _micro(c, s["sync"])
            other = predict_peak(bf16, s["sync"], c.devices, c.batch_size, micro).total
            alternatives.append(("bf16", other))
        saved = [f"{name} {mib(own - other)} MiB less" for name, other in alternatives]
        if saved:
            out.append(f"{c.label} (predicted {mib(own)} MiB): " + ", ".join(saved))
    return out


def _micro(c: Config, sync: str) -> int:
    """The passes per optimizer step of the configuration under `sync`: those its rows ran
    under its own, else its `accumulate_steps` axis's (another sync keeps the axis, not
    `sync: accumulate`'s option)."""
    if sync == c.settings["sync"]:
        return int(c.rows[0].get("micro_steps") or 1)
    return micro_steps(sync, {}, int(c.settings.get("accumulate_steps") or 1))


def _largest_part(c: Config) -> str:
    """The breakdown column with the largest median, and its share of the peak."""
    medians = {name: c.stat(column) for column, name in PARTS.items()}
    present = {name: s.median for name, s in medians.items() if s is not None}
    total = sum(present.values())
    if not present or total <= 0:
        return "n/a"
    name = max(present, key=lambda k: present[k])
    return f"{name} {present[name] / total:.0%}"
