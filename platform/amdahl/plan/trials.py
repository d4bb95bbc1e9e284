"""From a validated spec to its trials: the grid expanded, each point a `Trial` with a stable id.

Expansion is a cartesian product of the axes minus the `exclude` entries (`expand_grid`), each
point one typed `columns.TrialSettings` that its trial carries to the worker. Each trial's id
hashes its settings, not its position (`trial_id`), so a resume and MLflow recognise it; the
fields hashed when the rule was written are frozen as identity schema 1 below, so a field
added later leaves the ids of trials at its default as they were. Pure: no Ray, no torch.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import BaseModel

from amdahl.columns import AXES, AXIS_TABLE, SETTING_COLUMNS, TrialSettings, per_device_batch
from amdahl.plan.resources import ResourcePlan
from amdahl.spec.schema import SweepSpec, options_column
from amdahl.strategies import COMPILE_OPTIONS, STRATEGIES


@dataclass(frozen=True)
class Trial:
    """One point of the grid."""

    trial_id: str
    settings: TrialSettings
    resources: ResourcePlan
    refused: str | None = None  # why it will not run, or None
    #: Hash of what decides its input batches (Workload.input_key): trials with equal keys can
    #: share a launch's input pipeline. Default: all its parameters.
    input_key: str = ""
    #: Its peak tensor bytes per rank, predicted before it runs (plan.fits); None: unknown.
    predicted_peak_mem_bytes: float | None = None
    #: The largest per-device batch of its configuration predicted to fit the device (0: none);
    #: None where `resources.device_memory_gb` or the model's memory is unknown.
    largest_batch_fits: int | None = None

    def launch_key(self, across_devices: bool = False, streamed: bool = False) -> str:
        """Trials with equal keys share one worker group (same worker shape, same input);
        `across_devices` leaves the device count out (see SweepPlan.shares_across_devices);
        `streamed`: a preprocessing workload's launch streams one Ray Data pipeline, whose
        prefetch is then the launch's."""
        s = self.settings
        r = self.resources
        key = [r.cpus_per_worker, r.gpus_per_worker, s.data_workers, s.input]
        if streamed and s.input == "ray_data":
            key.append(s.prefetch_batches)  # one pipeline per launch (worker/input.py)
        if not across_devices:
            key.insert(0, s.devices)
        return stable_hash([*key, self.input_key or s.params])

    def identity(self, spec: SweepSpec) -> dict[str, Any]:
        """The columns its results rows will name its configuration by (as
        protocol/identity.row_identity writes them): what a label is made of."""
        s = self.settings
        return {
            "trial_id": self.trial_id,
            "workload": spec.workload,
            "params": json.dumps(s.params, sort_keys=True),
            **{k: getattr(s, k) for k in SETTING_COLUMNS},
            "options": options_column(s.options),
            "batch_size": int(per_device_batch(s.batch_size, s.devices, spec.train.scaling)),
            "scaling": spec.train.scaling,
        }


def expand_grid(
    spec: SweepSpec, workload_defaults: dict[str, Any], notes: list[str] | None = None
) -> list[TrialSettings]:
    """Cartesian product of all axes and `grid.options` lists, in file order, minus entries
    matching an `exclude`. A point whose settings equal an earlier one's (an option value its
    trial does not read) is dropped, and `notes` gets one line per option saying so."""
    axes: dict[str, list[Any]] = {a: list(getattr(spec.grid, a)) for a in AXES}
    param_axes = spec.grid.param_axes()
    option_axes = spec.grid.option_axes()
    names = [*axes, *(f"params.{k}" for k in param_axes), *(f"options.{k}" for k in option_axes)]
    values = [*axes.values(), *param_axes.values(), *option_axes.values()]
    out: list[TrialSettings] = []
    kept: dict[str, dict[str, Any]] = {}
    dropped: dict[str, set[str]] = {}  # option name -> the axis values of the trials dropped
    counts: dict[str, int] = {}
    for combo in itertools.product(*values):
        point = dict(zip(names, combo, strict=True))
        if any(all(point.get(k) == v for k, v in ex.items()) for ex in spec.exclude):
            continue
        axis_params = {
            k.removeprefix("params."): v for k, v in point.items() if k.startswith("params.")
        }
        swept = {
            k.removeprefix("options."): v for k, v in point.items() if k.startswith("options.")
        }
        settings = TrialSettings(
            **{a: point[a] for a in AXES},
            axis_params=axis_params,
            params={**workload_defaults, **spec.params, **axis_params},
            options=_relevant_options(spec, (point["compile"], point["sync"]), swept),
        )
        key = json.dumps(settings.as_dict(), sort_keys=True, default=str)
        first = kept.setdefault(key, point)
        if first is point:
            out.append(settings)
            continue
        for name in option_axes:  # the options whose values alone set it apart: unread
            if point[f"options.{name}"] != first[f"options.{name}"]:
                axis = "compile" if any(name in o for o in COMPILE_OPTIONS.values()) else "sync"
                dropped.setdefault(name, set()).add(f"{axis} {point[axis]}")
                counts[name] = counts.get(name, 0) + 1
    if notes is not None:
        for name, where in dropped.items():
            n = counts[name]
            notes.append(
                f"grid.options.{name} does not change {', '.join(sorted(where))} trials (they "
                f"do not read it): {n} duplicate trial{'s' if n > 1 else ''} dropped"
            )
    return out


#: Which `options` fields each axis value reads; only those enter a trial's settings and id.
#: The sync strategies' come from their table (strategies.py).
OPTIONS_USED_BY: dict[str, tuple[str, ...]] = {
    **COMPILE_OPTIONS,
    **{n: s.options for n, s in STRATEGIES.items()},
}

# --------------------------------------------------------------------------- trial identity
#
# A trial id hashes what changes what is measured. Sweep directories keep the ids they were
# recorded under and resume finds finished trials by id, so a field added to the schema must
# not change the id of a trial that leaves it at its default (docs/architecture.md, "Adding an
# axis"). The rule: the keys of identity schema 1 below (everything hashed when the rule was
# written) are always hashed, exactly as they were; any other key of the same section (a new
# axis, option, resources or train field) enters the identity only when its value differs from
# its default in the spec's schema (an axis's: columns.AXIS_TABLE). NEVER edit the schema-1
# sets: a key added to one changes the id of every trial.

#: Schema 1: the keys of a trial's settings (TrialSettings.as_dict) always hashed (the axes,
#: the workload's parameters, its options). `axis_params` never is (its values are in `params`).
ID_SCHEMA_1_SETTINGS = frozenset(
    {
        "devices",
        "batch_size",
        "precision",
        "compile",
        "data_workers",
        "input",
        "prefetch_batches",
        "sync",
        "params",
        "options",
    }
)
#: Schema 1: (axis value, option) pairs: the options always in the settings of a trial with
#: that axis value. (zero1 reads bucket_cap_mb too, but did not pass it on before; it enters
#: zero1's settings only when set to other than its default, as the rule says.)
ID_SCHEMA_1_OPTIONS = frozenset(
    {
        ("inductor", "compile_mode"),
        *(
            (sync, "bucket_cap_mb")
            for sync in ("ddp", "ddp_fp16", "ddp_bf16", "powersgd", "accumulate")
        ),
        ("powersgd", "powersgd_rank"),
        ("accumulate", "accumulate_steps"),
        ("local_sgd", "local_sgd_every"),
        ("param_server", "ps_shards"),
    }
)
#: Schema 1: the `resources` fields always hashed (after `resources: auto` is resolved).
ID_SCHEMA_1_RESOURCES = frozenset(
    {"use_gpu", "cpus_per_device", "gpus_per_device", "placement", "cpus_per_data_worker"}
)
#: `resources` fields that decide whether a trial runs, not what it measures: never hashed,
#: so a sweep planned against another device's memory keeps its trial ids.
UNMEASURED_RESOURCES = frozenset({"device_memory_gb", "memory_check"})
#: Schema 1: the `train` fields always hashed, as a list in this order.
ID_SCHEMA_1_TRAIN = ("steps", "warmup_steps", "seed", "lr", "scaling", "optimizer")
#: Schema 1: the `train` fields hashed as one block ("schedule") when any differs from its
#: default (an earlier hand-written form of the rule, kept as it was so its ids stay).
ID_SCHEMA_1_SCHEDULE = ("lr_scaling", "lr_base_batch", "lr_warmup_steps", "target")
#: Schema 1: the `train.target` fields always hashed when a target is set.
ID_SCHEMA_1_TARGET = frozenset({"metric", "value", "max_steps", "eval_every"})
#: `train` fields that never enter the id: they do not change what is measured (the profiler
#: pass runs after the measured window).
TRAIN_NOT_IN_ID = frozenset({"repeats", "max_failures", "profile_steps"})

_NO_DEFAULT = object()


def _default(model: type[BaseModel], name: str) -> Any:
    """A schema field's default as it is hashed (a model's default dumped), or _NO_DEFAULT."""
    info = model.model_fields.get(name)
    if info is None or info.is_required():
        return _NO_DEFAULT
    value = info.get_default(call_default_factory=True)
    return value.model_dump() if isinstance(value, BaseModel) else value


def _axis_default(name: str) -> Any:
    """An axis's default value (columns.AXIS_TABLE, which the spec's default list holds too),
    or _NO_DEFAULT for a setting that is no axis there."""
    axis = AXIS_TABLE.get(name)
    return _NO_DEFAULT if axis is None else axis.default


def _identity_fields(
    values: dict[str, Any], schema_1: frozenset[str], default: Callable[[str], Any]
) -> dict[str, Any]:
    """`values` less the keys outside `schema_1` that hold their default."""
    return {k: v for k, v in values.items() if k in schema_1 or v != default(k)}


def _section_identity(
    section: BaseModel, schema_1: frozenset[str], unmeasured: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """A spec section's fields as hashed: schema 1's, and the others where not at their
    default (the section's own class holds the defaults), less those that change nothing a
    trial measures."""
    fields = section.model_dump(exclude=set(unmeasured))
    return _identity_fields(fields, schema_1, partial(_default, type(section)))


def _relevant_options(
    spec: SweepSpec, values: tuple[str, ...], swept: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The options a trial's axis `values` (its compile and sync) read, the spec's unless
    `swept` (its point's `grid.options` values) sets them: schema 1's, then later ones where
    set to something other than their default (compile_cache: cold is left out, as before the
    rule)."""
    read = [(v, n) for v in values for n in OPTIONS_USED_BY.get(v, ())]
    default = partial(_default, type(spec.options))
    given = {**spec.options.model_dump(), **(swept or {})}
    values = {n: given[n] for _, n in read}
    # Schema 1's first, in the order they are read, so the settings stay as they were.
    first = [n for v, n in read if (v, n) in ID_SCHEMA_1_OPTIONS]
    later = [n for v, n in read if (v, n) not in ID_SCHEMA_1_OPTIONS and values[n] != default(n)]
    return {n: values[n] for n in (*first, *later)}


def trial_id(spec: SweepSpec, settings: TrialSettings) -> str:
    """Stable id: everything that changes what is measured, nothing about order or repeats;
    a field added to the schema enters it only when set to other than its default (above).
    The settings are hashed as the dict they were before they were typed (`as_dict`)."""
    t = spec.train
    hashed = {k: v for k, v in settings.as_dict().items() if k != "axis_params"}
    for k in hashed.keys() - ID_SCHEMA_1_SETTINGS:
        if _axis_default(k) is _NO_DEFAULT:
            raise ValueError(
                f"setting {k!r} is not in trial-id schema 1 and has no default in "
                "columns.AXIS_TABLE: it would change every trial id (docs/architecture.md, "
                '"Adding an axis")'
            )
    identity: dict[str, Any] = {
        "workload": spec.workload,
        "settings": _identity_fields(hashed, ID_SCHEMA_1_SETTINGS, _axis_default),
        "train": [getattr(t, name) for name in ID_SCHEMA_1_TRAIN],
        "resources": _section_identity(spec.resources, ID_SCHEMA_1_RESOURCES, UNMEASURED_RESOURCES),
    }
    schedule = {
        "lr_scaling": t.lr_scaling,
        "lr_base_batch": t.lr_base_batch if t.lr_scaling != "none" else None,
        "lr_warmup_steps": t.lr_warmup_steps,
        "target": _section_identity(t.target, ID_SCHEMA_1_TARGET) if t.target else None,
    }
    if schedule != {
        "lr_scaling": "none",
        "lr_base_batch": None,
        "lr_warmup_steps": 0,
        "target": None,
    }:
        identity["schedule"] = schedule
    known = frozenset({*ID_SCHEMA_1_TRAIN, *ID_SCHEMA_1_SCHEDULE, *TRAIN_NOT_IN_ID})
    later = {k: v for k, v in _section_identity(t, known).items() if k not in known}
    if later:
        identity["train_later"] = later
    return stable_hash(identity)


def shown_settings(settings: TrialSettings) -> dict[str, Any]:
    """A trial's settings as plan.json shows them: an axis added after identity schema 1 only
    where it leaves its default, as its id hashes them (so a sweep that leaves it there plans
    to the same plan.json as before it existed)."""
    return _identity_fields(settings.as_dict(), ID_SCHEMA_1_SETTINGS, _axis_default)


def stable_hash(obj: Any) -> str:
    """A short hash of `obj` as JSON (keys sorted): the same on every machine and run."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:10]
