"""Results rows grouped into configurations: the settings that identify one point of the grid,
its repeats, its label (`d2 b256 fp32 eager w1 ddp`), and the figures every report reads off it
(throughput, seconds per step, the performance speedup is a ratio of).

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from amdahl.analysis.stats import Stat, is_number
from amdahl.columns import AXIS_TABLE, SETTING_COLUMNS
from amdahl.spec.schema import OptionsSpec
from amdahl.strategies import options_read

#: What rows were measured under besides their axis values, set apart only where a sweep
#: directory holds rows of the same axis values measured under different settings (one resumed
#: with other settings, before `platform sweep --resume` refused that), so that those are never
#: taken for repeats of one configuration; None everywhere else. See `_measured_under`.
MEASURED_UNDER = ("steps", "warmup_steps", "target", "trial")
#: Columns that, with `devices`, identify one configuration.
SETTINGS = (
    "workload",
    "params",
    "scaling",
    "batch_size",
    *(c for c in SETTING_COLUMNS if c != "devices"),
    "options",
    *MEASURED_UNDER,
)
#: The no-communication ceiling's sync value.
NO_SYNC = "none"
#: Axes every label names, in axis order (devices and batch lead it); `_optional_axes` adds
#: the others.
LABELLED_AXES = tuple(name for name, axis in AXIS_TABLE.items() if axis.always_labelled)
#: Each option's label prefix (`ddp bucket100`), named where a sweep varies the option; an
#: option not listed is named `<name>=`.
OPTION_LABELS = {
    "compile_mode": "mode-",
    "compile_cache": "cache-",
    "bucket_cap_mb": "bucket",
    "powersgd_rank": "rank",
    "accumulate_steps": "acc",
    "local_sgd_every": "every",
    "ps_shards": "shards",
    "fsdp_reshard_after_forward": "reshard-",
    "fsdp_param_dtype": "param-",
    "fsdp_reduce_dtype": "reduce-",
}


class SyncAndScaling:
    """The sync strategy and scaling mode of whatever holds a configuration's `settings` (a
    configuration, a curve across device counts)."""

    settings: dict[str, Any]

    @property
    def sync(self) -> str:
        return self.settings["sync"] or ""

    @property
    def scaling(self) -> str:
        return self.settings["scaling"] or "weak"


@dataclass
class Config(SyncAndScaling):
    """One point of the grid (all settings including devices) and its repeats."""

    settings: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""

    @property
    def key(self) -> tuple:
        return tuple(self.settings[c] for c in (*SETTINGS, "devices"))

    @property
    def ok_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("status") == "ok" and is_number(r.get("throughput"))]

    @property
    def ok(self) -> bool:
        return bool(self.ok_rows)

    @property
    def devices(self) -> int:
        return int(self.settings["devices"] or 1)

    @property
    def batch_size(self) -> int | None:
        return self.settings["batch_size"]

    @property
    def device_type(self) -> str:
        names = {r.get("device_name") for r in self.rows if r.get("device_name")}
        return "cpu" if not names or names == {"cpu"} else "cuda"

    def stat(self, metric: str) -> Stat | None:
        return Stat.of(r.get(metric) for r in self.ok_rows)

    @property
    def throughput(self) -> Stat | None:
        return self.stat("throughput")

    @property
    def step_wall(self) -> Stat | None:
        """Seconds per optimizer step as the measured window saw them (data wait, loop overhead
        and the slowest rank included): measured_s / steps, else global batch / throughput."""
        return Stat.of(_step_wall(r) for r in self.ok_rows)

    @property
    def perf(self) -> Stat | None:
        """What speedup is a ratio of: throughput (weak) or 1 / seconds per step (strong)."""
        if self.scaling == "strong":
            wall = self.step_wall
            return wall.inverse() if wall and wall.lo > 0 else None
        return self.throughput

    @property
    def curve_key(self) -> tuple:
        """Settings without devices; the batch that stays fixed along the curve is per device
        (weak) or global (strong)."""
        s = dict(self.settings)
        s["batch_size"] = scale_batch(s)
        return tuple(s[c] for c in SETTINGS)


def _step_wall(row: dict[str, Any]) -> float | None:
    if is_number(row.get("measured_s")) and row.get("steps"):
        return row["measured_s"] / row["steps"]
    if is_number(row.get("throughput")) and row["throughput"] > 0 and row.get("global_batch"):
        return row["global_batch"] / row["throughput"]
    if is_number(row.get("step_time_s")):
        return row["step_time_s"] + (row.get("data_wait_s") or 0.0)
    return None


def scale_batch(settings: dict[str, Any]) -> int | None:
    """The batch that stays fixed as devices grow: per device (weak), global (strong)."""
    b = settings.get("batch_size")
    if b is None or settings.get("scaling") != "strong":
        return b
    return b * int(settings.get("devices") or 1)


def group_configs(rows: list[dict[str, Any]]) -> list[Config]:
    """Rows (repeats, any status) grouped into configurations, in a stable order: repeats share
    their axis values and what they were measured under (`_measured_under`)."""
    groups: dict[tuple, Config] = {}
    for row, measured in zip(rows, _measured_under(rows), strict=True):
        settings = {**_axis_settings(row), **measured}
        key = tuple(settings[c] for c in (*SETTINGS, "devices"))
        groups.setdefault(key, Config(settings=settings)).rows.append(row)
    configs = sorted(groups.values(), key=_order)
    varying = _varying_params(configs)
    optional = _optional_axes(configs)
    options = _varying_options(configs)
    for c in configs:
        c.label = config_label(c.settings, varying, optional, options)
    return configs


def option_values(settings: dict[str, Any]) -> dict[str, Any]:
    """The options a configuration's `options` column records (those away from their default)."""
    return _params(settings.get("options"))


def config_options(settings: dict[str, Any]) -> dict[str, Any]:
    """Every option a configuration's compile and sync values read, at the value it ran with
    (its `options` column, else the option's default)."""
    given = option_values(settings)
    read = options_read(str(settings.get("compile")), str(settings.get("sync")))
    defaults = {k: f.default for k, f in OptionsSpec.model_fields.items()}
    return {
        **{k: given.get(k, defaults[k]) for k in read if k in defaults},
        **{k: v for k, v in given.items() if k not in read},
    }


def _varying_options(configs: list[Config]) -> list[str]:
    """The options that differ between the configurations that read them (only those go into
    labels), in OptionsSpec's order."""
    values: dict[str, set[str]] = {}
    for c in configs:
        for k, v in config_options(c.settings).items():
            values.setdefault(k, set()).add(json.dumps(v))
    order = [*OptionsSpec.model_fields, *sorted(values.keys() - OptionsSpec.model_fields.keys())]
    return [k for k in order if len(values.get(k, ())) > 1]


def _option_text(name: str, value: Any) -> str:
    """`bucket100`, `reshard-false`, `param-default`: one option's label fragment."""
    if value is None:
        text = "default"
    elif isinstance(value, bool):
        text = json.dumps(value)
    elif isinstance(value, float):
        text = f"{value:g}"
    else:
        text = str(value)
    return OPTION_LABELS.get(name, f"{name}=") + text


def _optional_axes(configs: list[Config]) -> list[str]:
    """The axes beyond LABELLED_AXES that labels name: each one some configuration of this
    sweep sets away from its default. Named in every label then, defaults included, so that
    labels read the same way across the sweep (`p1` beside `p4`, never beside nothing)."""
    out = []
    for axis in SETTING_COLUMNS:
        if axis in LABELLED_AXES:
            continue
        default = AXIS_TABLE[axis].default
        if any(c.settings.get(axis) not in (None, default) for c in configs):
            out.append(axis)
    return out


def _axis_settings(row: dict[str, Any]) -> dict[str, Any]:
    settings = {c: row.get(c) for c in (*SETTINGS, "devices") if c not in MEASURED_UNDER}
    settings["scaling"] = settings["scaling"] or "weak"
    return settings


def _measured_under(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per row, the MEASURED_UNDER values that tell it apart from rows of the same axis values
    measured under other settings.

    - The training length: `steps` (in time-to-target mode the `target` instead, as the steps
      run then differ by repeat) and `warmup_steps`; each is None unless the ok rows disagree
      on it. A row lacking them (a launch that crashed records no target) takes its trial's.
    - `trial`: the trial id, which hashes every setting that changes a measurement (lr, seed,
      optimizer, resources, options, ...), where rows of the same axis values and length
      still come from several trials; else None.

    In a directory measured under one set of settings all of these are None: keys, labels and
    comparisons between directories are unchanged.
    """
    by_trial: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        by_trial.setdefault(r.get("trial_id"), []).append(r)

    def own_or_trials(r: dict[str, Any], column: str) -> Any:
        if r.get(column) is not None:
            return r[column]
        same_trial = by_trial[r.get("trial_id")]
        return next((o[column] for o in same_trial if o.get(column) is not None), None)

    out = []
    for r in rows:
        target = own_or_trials(r, "target")
        out.append(
            {
                "steps": None if target else r.get("steps"),
                "warmup_steps": own_or_trials(r, "warmup_steps"),
                "target": target,
            }
        )
    ok = [m for r, m in zip(rows, out, strict=True) if r.get("status") == "ok"]
    for column in ("steps", "warmup_steps", "target"):
        if len({m[column] for m in ok}) <= 1:
            for m in out:
                m[column] = None
    keys = [
        (tuple(_axis_settings(r).values()), tuple(m.values()))
        for r, m in zip(rows, out, strict=True)
    ]
    trials: dict[tuple, set[Any]] = {}
    for r, key in zip(rows, keys, strict=True):
        trials.setdefault(key, set()).add(r.get("trial_id"))
    for r, m, key in zip(rows, out, keys, strict=True):
        m["trial"] = r.get("trial_id") if len(trials[key]) > 1 else None
    return out


def _order(c: Config) -> tuple:
    s = c.settings
    return (
        str(s["workload"]),
        str(s["params"]),
        str(s["precision"]),
        str(s["compile"]),
        s["data_workers"] or 0,
        s["sync"] == NO_SYNC,
        str(s["sync"]),
        scale_batch(s) or 0,
        c.devices,
    )


def _varying_params(configs: list[Config]) -> list[str]:
    """Workload parameters that differ between configurations (only those go into labels)."""
    parsed = [_params(c.settings["params"]) for c in configs]
    keys = sorted({k for p in parsed for k in p})
    return [k for k in keys if len({json.dumps(p.get(k), sort_keys=True) for p in parsed}) > 1]


def _params(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def config_label(
    settings: dict[str, Any],
    varying_params: list[str] = (),
    optional_axes: list[str] = (),
    varying_options: list[str] = (),
) -> str:
    """Short label like the plan's: `d2 b256 fp32 eager w1 ddp` (strong: `gb512` = global),
    then each of `optional_axes` (`p4`, `torch_loader`), defaults included, then each of
    `varying_options` the configuration reads (`bucket100`), then the varying workload
    parameters."""
    s = settings
    if s.get("scaling") == "strong" and s.get("batch_size") is not None:
        batch = f"gb{scale_batch(s)}"
    else:
        batch = AXIS_TABLE["batch_size"].label.format(s.get("batch_size"))
    parts = [
        batch if axis == "batch_size" else AXIS_TABLE[axis].label.format(s.get(axis))
        for axis in LABELLED_AXES
    ]
    for axis in optional_axes:
        value = s.get(axis)
        value = AXIS_TABLE[axis].default if value is None else value
        parts.append(AXIS_TABLE[axis].label.format(value))
    options = config_options(s)
    parts += [_option_text(k, options[k]) for k in varying_options if k in options]
    params = _params(s.get("params"))
    parts += [f"{k}={json.dumps(params.get(k), separators=(',', ':'))}" for k in varying_params]
    # Set only where rows of equal axis values were measured under other settings.
    for column, name in (("steps", "steps"), ("warmup_steps", "warmup"), ("trial", "trial")):
        if s.get(column) is not None:
            parts.append(f"{name}={s[column]}")
    if s.get("target") is not None:
        parts.append(str(s["target"]))
    return " ".join(parts)
