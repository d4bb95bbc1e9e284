"""Will a trial fit? Its predicted peak memory per rank, and the refusal of one that would not.

The prediction is analysis.memory_model's over the workload's measured facts (the memory probe,
which the driver runs: plan/ never imports torch); a trial is refused when it is predicted
above `resources.device_memory_gb` less analysis.memory_model.DEVICE_MEMORY_MARGIN, with the
figures and what would fit. `resources.memory_check: false` runs it anyway.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from amdahl.analysis.memory_model import (
    DEVICE_MEMORY_MARGIN,
    UNBOUNDED_BATCH,
    MemoryFacts,
    MemoryPrediction,
    largest_batch,
    largest_power_of_two,
    predict_peak,
    usable_bytes,
)
from amdahl.columns import TrialSettings, per_device_batch
from amdahl.errors import UserError
from amdahl.spec.schema import SweepSpec
from amdahl.strategies import STRATEGIES, micro_steps

#: (workload parameters, precision) -> the probe's facts, or None where it could not run.
FactsSource = Callable[[dict, str], MemoryFacts | None]


def predict_trial(
    spec: SweepSpec, settings: TrialSettings, facts: FactsSource | None
) -> MemoryPrediction | None:
    """The trial's predicted peak per rank, or None without facts for its parameters."""
    found = facts(settings.params, settings.precision) if facts else None
    if found is None:
        return None
    batch = per_device_batch(settings.batch_size, settings.devices, spec.train.scaling)
    return predict_peak(
        found,
        settings.sync,
        settings.devices,
        batch,
        _micro(settings),
        checkpointing=settings.activation_checkpointing,
        options=settings.options,
        precision=settings.precision,
    )


def resolve_max_batches(
    spec: SweepSpec,
    grid: list[TrialSettings],
    facts: FactsSource | None,
    stated: float | None,
) -> tuple[list[TrialSettings], str | None]:
    """The grid with each `batch_size: max` point given the largest power of two predicted
    to fit its configuration (1 where none does: the plan then refuses it, saying why), a
    point that then equals another dropped, and a line saying what `max` became (None: no
    `max` in the grid)."""
    if "max" not in spec.grid.batch_size:
        return grid, None
    gb = device_memory_gb(spec, stated)
    if gb is None:
        raise UserError(
            "grid.batch_size: max needs the device's memory: set resources.device_memory_gb "
            "(GB), e.g. --set resources.device_memory_gb=80"
        )
    out, seen, chosen = [], set(), {}
    for s in grid:
        if s.batch_size == "max":
            s = dataclasses.replace(s, batch_size=_max_batch(s, facts, gb))
            chosen[_memory_label(s)] = s.batch_size
        key = repr(s.as_dict())
        if key not in seen:
            seen.add(key)
            out.append(s)
    resolved = ", ".join(f"{k} -> {v}" for k, v in chosen.items())
    return out, f"grid.batch_size max (fits {gb:g} GB): {resolved}"


def _memory_label(s: TrialSettings) -> str:
    """The settings that decide a trial's memory, as the `max` line names a configuration."""
    extra = [f"a{s.accumulate_steps}"] if s.accumulate_steps != 1 else []
    if s.activation_checkpointing != "none":
        extra.append(f"ac-{s.activation_checkpointing}")
    return " ".join([f"d{s.devices}", s.precision, s.sync, *extra])


def _max_batch(settings: TrialSettings, facts: FactsSource | None, gb: float) -> int:
    found = facts(settings.params, settings.precision) if facts else None
    if found is None:
        raise UserError(
            "grid.batch_size: max needs the model's memory, and the memory probe could not "
            "measure it (see the warning above); list the batch sizes instead"
        )
    limit = _largest_batch(found, settings, gb)
    if limit >= UNBOUNDED_BATCH:
        raise UserError(
            "grid.batch_size: max: the model's memory does not grow with its batch, so no "
            "batch is the largest that fits; list the batch sizes instead"
        )
    return max(1, largest_power_of_two(limit))


def _largest_batch(found: MemoryFacts, settings: TrialSettings, gb: float) -> int:
    """analysis.memory_model.largest_batch for the trial's own settings."""
    return largest_batch(
        found,
        settings.sync,
        settings.devices,
        gb,
        _micro(settings),
        checkpointing=settings.activation_checkpointing,
        options=settings.options,
        precision=settings.precision,
    )


def device_memory_gb(spec: SweepSpec, stated: float | None) -> float | None:
    """The device's memory the plan holds trials to: `resources.device_memory_gb`, else what
    the workload states (a simulated device's), else None (unknown: nothing is refused)."""
    return spec.resources.device_memory_gb or stated


def largest_fitting_batch(
    spec: SweepSpec, settings: TrialSettings, facts: FactsSource | None, stated: float | None
) -> int | None:
    """The largest per-device batch of the trial's configuration predicted to fit its device
    (0: none does), or None where the device's memory or the model's facts are unknown."""
    gb = device_memory_gb(spec, stated)
    found = facts(settings.params, settings.precision) if facts and gb else None
    if found is None:
        return None
    return _largest_batch(found, settings, gb)


def memory_problem(
    spec: SweepSpec,
    settings: TrialSettings,
    prediction: MemoryPrediction | None,
    facts: FactsSource | None,
    stated: float | None = None,
) -> str | None:
    """Why the trial will not fit its device, with what would, or None (it fits, nothing is
    known of the device or the model, or the check is off)."""
    gb = device_memory_gb(spec, stated)
    if prediction is None or gb is None or not spec.resources.memory_check:
        return None
    usable = usable_bytes(gb)
    if prediction.total <= usable:
        return None
    found = facts(settings.params, settings.precision) if facts else None
    fits = _what_fits(spec, settings, found, gb) if found else []
    dominant = prediction.dominant()
    where = (
        f"resources.device_memory_gb {gb:g}"
        if spec.resources.device_memory_gb
        else f"the {gb:g} GB the workload states"
    )
    return (
        f"memory: predicted {_size(prediction.total)} per device, over the {_size(usable)} "
        f"usable of {where} "
        f"({DEVICE_MEMORY_MARGIN:.0%} kept free); most of it {dominant} "
        f"({_size(prediction.parts[dominant])})"
        + (f"; {' or '.join(fits)} would fit" if fits else "; nothing smaller fits either")
        + " (resources.memory_check: false runs it anyway)"
    )


def _micro(settings: TrialSettings, sync: str | None = None) -> int:
    """The trial's passes per optimizer step (under `sync` instead of its own, if given)."""
    return micro_steps(sync or settings.sync, settings.options, settings.accumulate_steps)


def _size(nbytes: float) -> str:
    """Bytes in the device's own unit (GB, 1e9 bytes) or MB where under one."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def _what_fits(
    spec: SweepSpec, settings: TrialSettings, facts: MemoryFacts, gb: float
) -> list[str]:
    """The nearest changes predicted to fit: a smaller per-device batch, a sharded strategy."""
    p = settings.devices
    out = []
    mode = settings.activation_checkpointing
    limit = largest_batch(
        facts,
        settings.sync,
        p,
        gb,
        _micro(settings),
        checkpointing=mode,
        options=settings.options,
        precision=settings.precision,
    )
    if limit >= 1:
        out.append(f"per-device batch <= {limit}")
    batch = per_device_batch(settings.batch_size, p, spec.train.scaling)
    usable = usable_bytes(gb)

    def fits(sync: str, checkpointing: str) -> bool:
        micro = _micro(settings, sync)
        peak = predict_peak(
            facts,
            sync,
            p,
            batch,
            micro,
            checkpointing=checkpointing,
            options=settings.options,
            precision=settings.precision,
        )
        return peak.total <= usable

    for sync in ("zero1", "fsdp"):
        if sync != settings.sync and p > 1 and STRATEGIES[sync].needs_cuda is None:
            if fits(sync, mode):
                out.append(f"sync {sync}")
    for other in facts.checkpointed:
        if other != mode and fits(settings.sync, other):
            out.append(f"activation_checkpointing {other}")
    return out
