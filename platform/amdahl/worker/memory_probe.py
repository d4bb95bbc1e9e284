"""The memory probe: what a workload's plain model holds, measured once, before any trial runs.

The planner's memory model (analysis/memory_model.py) needs the model's parameter, gradient,
optimizer-state and buffer bytes and what a training step adds per sample. This measures them
on this process's CPU, where the data checks already run (driver/planning.py): the plain model
(no sync wrapper) in the trial's precision with the sweep's optimizer, three steps at each of
two small batches, the third under the tensor ledger (worker/tensor_ledger.py), the same count a
trial's last warmup step takes. Seconds for a small model; the answer is cached beside the
generated data (data.storage's cache, `memory-probes/`), keyed by the workload's source file,
its class, parameters, precision, optimizer and torch's version, so a changed model is probed
again and a second plan reads a file.

A driver-side entry point: the driver calls `probe_memory` and nothing else here.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from amdahl.data.storage import DEFAULT_CACHE, read_table, resolve_source, table_columns
from amdahl.spec.schema import TrainSpec
from amdahl.worker.checkpointing import STRIDE, apply_checkpointing
from amdahl.worker.sync import shard_units
from amdahl.worker.tensor_ledger import tracked_step
from amdahl.worker.training import Precision, make_optimizer_factory
from amdahl.worker.user_output import printed_once
from amdahl.workload.api import Workload

#: The two batches the per-sample line is drawn through: small, for a quick probe, but not
#: the smallest, where kernels take other paths (the small GPT's bytes per sample were 2.5%
#: lower from 2 to 8 than from 16 on, and steady from there to 256).
PROBE_BATCHES = (8, 32)
#: Bumped when what the probe measures changes, so older cached answers are not read.
PROBE_VERSION = 4
#: Parameter bytes above which the probe does not build the model on the driver's CPU (it would
#: hold them several times over: parameters, gradients, optimizer state).
PROBE_MAX_PARAM_BYTES = 2 * 2**30


class ProbeSkipped(Exception):
    """The probe did not measure this model, and why (the plan shows no prediction)."""


def probe_memory(
    workload: Workload, precision: str, optimizer: str, seed: int, cache: Path = DEFAULT_CACHE
) -> dict[str, Any]:
    """analysis.memory_model.MemoryFacts' fields for `workload` in `precision` with `optimizer`
    (sgd or adamw), from the cache or measured now. An inductor trial is predicted from the
    eager model (`source`: eager): the ledger cannot see what inductor's code allocates."""
    key = _cache_key(workload, precision, optimizer)
    path = cache / "memory-probes" / f"{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    size = _meta_param_bytes(workload)
    if size > PROBE_MAX_PARAM_BYTES:
        raise ProbeSkipped(
            f"{size / 2**30:.1f} GiB of parameters: too large to probe on the driver's CPU"
        )
    facts = _measure(workload, precision, optimizer, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(facts))
    tmp.replace(path)
    return facts


def _measure(workload: Workload, precision: str, optimizer: str, seed: int) -> dict[str, Any]:
    """The plain model's step line and state, and where the workload names blocks, the step
    line with each activation checkpointing mode (`checkpointed`: mode -> [intercept, bytes
    per sample]; the state is the plain model's, which checkpointing does not change)."""
    modes = ("none", *STRIDE) if workload.names_blocks() else ("none",)
    lines = {m: _step_line(workload, Precision.of(precision), optimizer, seed, m) for m in modes}
    intercept, per_sample, state = lines.pop("none")
    return {
        **state,
        "step_intercept": intercept,
        "step_per_sample": per_sample,
        "probe_batches": list(PROBE_BATCHES),
        "source": "eager",
        "checkpointed": {m: [a, k] for m, (a, k, _) in lines.items()},
    }


def _step_line(
    workload: Workload, precision: Precision, optimizer: str, seed: int, checkpointing: str
) -> tuple[float, float, dict[str, Any]]:
    """(intercept, bytes per sample, state) of what a step adds at its peak, through the
    ledger's peaks at the two PROBE_BATCHES."""
    (b0, b1), peaks = PROBE_BATCHES, []
    for batch in PROBE_BATCHES:
        peak, state = _ledger_peak(workload, precision, optimizer, (batch, seed), checkpointing)
        peaks.append(peak)
    slope = (peaks[1] - peaks[0]) / (b1 - b0)
    held = state["param_bytes"] + state["optimizer_bytes"] + state["buffer_bytes"]
    return peaks[0] - held - slope * b0, slope, state


def _ledger_peak(
    workload: Workload,
    precision: Precision,
    optimizer: str,
    batch_seed: tuple[int, int],
    checkpointing: str = "none",
) -> tuple[float, dict[str, Any]]:
    """The ledger's peak over the third step of the plain model (its blocks checkpointed as
    asked), and its state's bytes."""
    batch, seed = batch_seed
    device = torch.device("cpu")
    torch.manual_seed(seed)
    with printed_once():
        model = apply_checkpointing(workload, workload.build_model(), checkpointing)
    if precision.weights_dtype is not None:
        model = model.to(precision.weights_dtype)
    opt = make_optimizer_factory(TrainSpec(optimizer=optimizer))(model.parameters())
    scaler = precision.scaler(device)
    x, y = workload.split_batch(_batch(workload, batch, seed))
    x = precision.cast_input(x)

    def step() -> None:
        with precision.autocast(device):
            loss = workload.forward(model, x, y)[1]
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    step()
    with tracked_step(model, opt, 0) as ledger:
        step()
    params = [p for p in model.parameters()]
    state = {
        "param_bytes": _nbytes(params),
        "grad_bytes": _nbytes([p for p in params if p.requires_grad]),
        "optimizer_bytes": _nbytes(
            [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        ),
        "buffer_bytes": _nbytes(list(model.buffers())),
        "largest_units": _largest_units(model),
    }
    return float(ledger.peak), state


def _meta_param_bytes(workload: Workload) -> int:
    """The model's parameter bytes, built on the meta device (no memory): 0 where it cannot
    be built there (the probe then builds it for real)."""
    try:
        with torch.device("meta"):
            with printed_once():
                return _nbytes(list(workload.build_model().parameters()))
    except Exception:  # noqa: BLE001 - a model that needs real tensors to build
        return 0


def _batch(workload: Workload, batch: int, seed: int) -> dict[str, torch.Tensor]:
    """`batch` training rows as tensors, preprocessed as the input pipeline would: the first
    rows of the user's parquet (`params.data`), else generated ones."""
    source = workload.source("train")
    if source is not None:
        rows = table_columns(read_table(resolve_source(source)).slice(0, batch))
    else:
        rows = workload.generate("train", batch, seed)
    if workload.preprocesses:
        rows = workload.preprocess(rows, training=True)
    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in rows.items()}


def _largest_units(model: torch.nn.Module) -> list[int]:
    """FSDP2's shard units as the fsdp strategy makes them (worker.sync.shard_units, then the
    root with what they leave): the two largest units' parameter bytes, largest first."""
    units = [_nbytes(list(u.parameters())) for u in shard_units(model)]
    rest = _nbytes(list(model.parameters())) - sum(units)
    return sorted([u for u in (*units, rest) if u > 0], reverse=True)[:2]


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _cache_key(workload: Workload, precision: str, optimizer: str) -> str:
    cls = type(workload)
    try:
        source = Path(inspect.getfile(cls)).read_bytes()
    except (OSError, TypeError):  # a class defined where no file holds it: never cached stale
        source = repr(id(cls)).encode()
    identity = {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "source": hashlib.sha256(source).hexdigest(),
        "params": workload.params,
        "precision": precision,
        "optimizer": optimizer,
        "torch": torch.__version__,
        "version": PROBE_VERSION,
    }
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]
