"""The report's recommendation as something to run: best.yaml, a sweep file beside the report
that `platform sweep` runs as written, and the same configuration as a Ray Train script.

best.yaml is the sweep's own spec.yaml with every axis pinned to the recommended configuration's
value, the resources pinned to what the sweep's plan gave it (plan.json: `resources: auto`
chosen), the search and `exclude` dropped, and `train.repeats` at least 3, so it measures the one
configuration again with its spread. Its comments say where it came from and the figures it
should reproduce. With the same workload, train section and resources, its one trial has the
recommended configuration's trial id (plan/trials.py), which tests/integration/test_best_yaml.py
checks. Where nothing can be recommended, no best.yaml is written (a stale one is removed) and
report.md says why. See docs/architecture.md, "A sweep directory".

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from amdahl.analysis.configs import Config, config_options, scale_batch
from amdahl.analysis.stats import Stat
from amdahl.columns import AXES, SETTING_COLUMNS, TrialSettings
from amdahl.errors import UserError
from amdahl.files import write_private
from amdahl.report.build import Report
from amdahl.report.recommend import Pick
from amdahl.report.render_text import md_block
from amdahl.report.train_snippet import RunSettings, ray_train_snippet
from amdahl.spec.load import validate_spec
from amdahl.sweepdir.layout import BEST_FILE, PLAN_FILE, SPEC_FILE, SweepDir

#: Repeats of the confirmation run: enough for a spread (the report's rule: >= 3).
CONFIRM_REPEATS = 3
#: Sections of the sweep's spec kept as they were (the grid is pinned, train and resources
#: are rewritten; search and exclude are dropped).
KEPT_SECTIONS = (
    "workload",
    "params",
    "workload_path",
    "options",
    "isolation",
    "tracking",
    "report",
    "storage",
)
#: best.yaml's name for analysis.configs.Config.step_wall among the columns of FIGURES.
STEP_WALL = "step_wall"
#: The figures best.yaml's comments name, as (column, how it is called, format).
FIGURES = (
    ("throughput", "throughput (samples/s)", "{:,.0f}"),
    # the report's figure ("Where the time went": the measured window / steps), not the
    # median step's compute (`step_time_s`, without its data wait): one step time everywhere
    (STEP_WALL, "seconds per step", "{:.4g}"),
    ("val_accuracy", "val accuracy", "{:.4f}"),
    ("val_loss", "val loss", "{:.4f}"),
    ("time_to_target_s", "time to target (s)", "{:.3g}"),
)


@dataclass
class Best:
    """The recommended configuration, as best.yaml and as a Ray Train script."""

    pick: Pick
    #: best.yaml's mapping (validated by amdahl.spec.load.validate_spec)
    spec: dict[str, Any]
    #: the file's text: the comments, then the mapping
    text: str
    snippet: str

    @property
    def config(self) -> Config:
        return self.pick.config


@dataclass
class BestFile:
    """What `write_best` did: best.yaml's path, or why there is none."""

    best: Best | None
    path: Path | None
    reason: str = ""


def sweep_command(path: str | Path) -> str:
    """The exact command that runs best.yaml."""
    return f"platform sweep {shlex.quote(str(path))}"


def write_best(sweep_dir: str | Path, report: Report) -> BestFile:
    """best.yaml into the sweep directory, or none (any old one removed) with the reason."""
    target = SweepDir(sweep_dir).best
    found = best_config(report, target)
    if isinstance(found, str):
        target.unlink(missing_ok=True)  # a stale best.yaml would contradict the report
        return BestFile(None, None, found)
    write_private(target, found.text)
    return BestFile(found, target)


def best_config(report: Report, path: str | Path = BEST_FILE) -> Best | str:
    """The recommended configuration as best.yaml (for `path`), or why there is none."""
    pick = _pick(report)
    if isinstance(pick, str):
        return pick
    if report.spec is None:
        return (
            f"no readable {SPEC_FILE} in the sweep directory, and best.yaml is the sweep's own "
            "spec with every axis pinned"
        )
    try:
        spec = _pinned_spec(report, pick.config)
        validate_spec(spec, source=str(path))
    except (UserError, KeyError, TypeError, ValueError) as e:
        return f"the pinned sweep file does not validate ({e})"
    settings = run_settings(report, pick.config)
    header = _header(report, pick, path, spec["train"]["repeats"])
    text = "\n".join(header) + "\n" + yaml.safe_dump(spec, sort_keys=False)
    return Best(pick, spec, text, ray_train_snippet(settings))


def _pick(report: Report) -> Pick | str:
    """The pick the sweep asked for (search.objective throughput_per_device: that one), else
    the report's headline pick (throughput); or why nothing can be recommended."""
    picks = report.recommendation.picks
    if not picks:
        if not any(c.ok for c in report.configs):
            return "no trial ran ok (see Failed, out-of-memory, diverged and refused trials)"
        return (
            "no configuration qualifies: every ok one is the sync none ceiling or is flagged "
            "for training quality (see Recommendation)"
        )
    search = (report.spec or {}).get("search") or {}
    want = "throughput per device" if search.get("objective") == "throughput_per_device" else None
    return next((p for p in picks if p.goal == want), picks[0])


def _pinned_spec(report: Report, c: Config) -> dict[str, Any]:
    """spec.yaml with every axis at `c`'s value, its planned resources and a confirming train
    section; the search and exclusions dropped."""
    raw = report.spec or {}
    spec: dict[str, Any] = {"name": f"{raw['name']}-best"}
    spec.update({k: raw[k] for k in KEPT_SECTIONS if raw.get(k) is not None})
    tracking = dict(raw.get("tracking") or {})
    tracking["experiment"] = tracking.get("experiment") or raw["name"]  # beside the sweep's runs
    spec["tracking"] = tracking
    train = dict(raw.get("train") or {})
    train["repeats"] = max(CONFIRM_REPEATS, int(train.get("repeats") or 1))
    for column in ("steps", "warmup_steps"):  # where rows of one directory differ in length
        if c.settings.get(column) is not None:
            train[column] = c.settings[column]
    spec["train"] = train
    spec["grid"] = _pinned_grid(raw.get("grid") or {}, c)
    ran = _options_ran(raw, c)
    if ran:
        spec["options"] = {**(raw.get("options") or {}), **ran}
    spec["resources"] = dict(report.planned_resources or raw.get("resources") or {})
    return spec


def _pinned_grid(grid: dict[str, Any], c: Config) -> dict[str, Any]:
    """One value per axis: the configuration's (the axis value of its batch: global under
    strong scaling), a `params.<name>` axis from its parameters; an axis its rows do not record
    (an older table) keeps the sweep's value where it had one."""
    values = {axis: c.settings.get(axis) for axis in AXES}
    values["batch_size"] = scale_batch(c.settings)
    values["devices"] = c.devices
    pinned = {}
    for axis, value in values.items():
        if value is not None:
            pinned[axis] = [value]
        elif isinstance(grid.get(axis), list) and len(grid[axis]) == 1:
            pinned[axis] = list(grid[axis])
    params = _params(c)
    for key, listed in grid.items():
        if key.startswith("params."):
            name = key.removeprefix("params.")
            pinned[key] = [params[name]] if name in params else list(listed)[:1]
    return pinned


def _options_ran(raw: dict[str, Any], c: Config) -> dict[str, Any]:
    """The options `c` ran at that the spec's options section may not say: those its rows
    record (its `options` column) and those the sweep swept (`grid.options`), so that a swept
    option is pinned, in the options section, to the configuration's value."""
    try:
        recorded = json.loads(c.settings.get("options") or "{}")
    except ValueError:
        recorded = {}
    lists = (raw.get("grid") or {}).get("options") or {}
    pinned = {k for k, v in lists.items() if v is not None}
    pinned |= set(recorded) if isinstance(recorded, dict) else set()
    return {k: v for k, v in config_options(c.settings).items() if k in pinned}


def _params(c: Config) -> dict[str, Any]:
    try:
        value = json.loads(c.settings.get("params") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def run_settings(report: Report, c: Config) -> RunSettings:
    """What the Ray Train script needs of configuration `c`: its axis values as its rows were
    measured under them (`TrialSettings.from_row`: an axis its rows do not record at its
    default), the spec's options (with those it ran at: `_options_ran`), train and
    resources."""
    raw = report.spec or {}
    options = {k: v for k, v in (raw.get("options") or {}).items() if v is not None}
    options.update(_options_ran(raw, c))
    resources = report.planned_resources or raw.get("resources") or {}
    train = raw.get("train") or {}
    lr = c.stat("lr")  # the rate after linear scaling, where the sweep scaled it
    settings = TrialSettings.from_row(c.settings, options)
    return RunSettings(
        label=c.label,
        devices=c.devices,
        batch_size=int(c.batch_size or 1),
        **{axis: getattr(settings, axis) for axis in SETTING_COLUMNS if axis != "devices"},
        compile_mode=str(options.get("compile_mode") or "default"),
        options=settings.options,
        optimizer=str(train.get("optimizer") or "sgd"),
        lr=float(lr.median if lr else train.get("lr") or 0.05),
        use_gpu=bool(resources.get("use_gpu")),
        cpus_per_device=resources.get("cpus_per_device"),
        gpus_per_device=float(resources.get("gpus_per_device") or 1.0),
        placement=str(resources.get("placement") or "pack"),
        workload=str(raw.get("workload") or "mlp"),
        params=settings.params,
        seed=int(train.get("seed") or 0),
    )


def _header(report: Report, pick: Pick, path: str | Path, repeats: int) -> list[str]:
    """The comments at the top of best.yaml: origin, command, the figures to reproduce."""
    c = pick.config
    ok = c.ok_rows
    ids = sorted({str(r.get("trial_id")) for r in ok if r.get("trial_id")})
    where = sorted({str(r.get("device_name")) for r in ok if r.get("device_name")})
    lines = [
        f"# best.yaml: the configuration sweep {report.name} recommends, to run it again.",
        f"# Written with its report from the sweep's results.parquet, {SPEC_FILE} and {PLAN_FILE}.",
        f"# Run it as written:  {sweep_command(path)}",
        f"# Best by {pick.goal}: {c.label}" + (f" (trial {', '.join(ids)})" if ids else ""),
        f"# from {len(ok)} ok run(s)" + (f" on {', '.join(where)}" if where else "") + ".",
        "# It should reproduce (median, range over the runs, spread = range / median):",
    ]
    for column, name, fmt in FIGURES:
        stat = c.step_wall if column == STEP_WALL else c.stat(column)
        if stat is not None:
            lines.append(f"#   {name:<24} {_figure(stat, fmt)}")
    lines += [
        "# Every axis is pinned to that value and the resources to what the sweep's plan gave",
        "# it, so its trial id is the one above; search and exclude are dropped, and",
        f"# train.repeats is {repeats}, so the confirmation measures its own spread.",
    ]
    if ":" in str((report.spec or {}).get("workload", "")) and not (report.spec or {}).get(
        "workload_path"
    ):
        lines.append(
            "# The workload's code is looked for next to this file, then in the working directory:"
        )
        lines.append(
            "# run from the folder the sweep ran from, or set workload_path to its folder."
        )
    return lines


def _figure(stat: Stat, fmt: str) -> str:
    value = fmt.format(stat.median)
    if stat.n <= 1:
        return f"{value} (one run: spread not measured)"
    return (
        f"{value} ({fmt.format(stat.lo)} to {fmt.format(stat.hi)}, spread "
        f"{stat.rel_spread:.1%}, n={stat.n})"
    )


def best_markdown(outcome: BestFile) -> str:
    """report.md's closing section: the command that runs best.yaml and the Ray Train lines,
    or why there is no best.yaml."""
    lines = ["", "## Run the recommended configuration", ""]
    if outcome.best is None or outcome.path is None:
        lines.append(md_block(f"No {BEST_FILE} was written: {outcome.reason}."))
        return "\n".join(lines) + "\n"
    best = outcome.best
    lines += [
        md_block(
            f"{BEST_FILE}, beside this report, is this sweep with every axis pinned to "
            f"{best.config.label} (best by {best.pick.goal}) and "
            f"{best.spec['train']['repeats']} repeats, to confirm it; its first lines list the "
            "figures it should reproduce:"
        ),
        "",
        "```sh",
        sweep_command(outcome.path),
        "```",
        "",
        md_block(
            "The same configuration as the lines of a Ray Train script (torch's and Ray "
            "Train V2's names):"
        ),
        "",
        "```python",
        best.snippet.rstrip("\n"),
        "```",
    ]
    return "\n".join(lines) + "\n"
