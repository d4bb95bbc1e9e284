"""Which configurations matter most, so a report of any size reads best first: configurations
grouped into families (one family = every setting but the device count, the grid point a
scaling curve follows), ranked by the sweep's objective.

- The objective: spec.yaml's `search.objective` where it says something other than the default
  (throughput), else time to target where the rows have a `train.target`, else throughput. Each
  configuration's value is the median over its ok repeats of search.objectives.objective_value, so
  the report ranks as the halving search does.
- A family's value is its best configuration's, among those the recommendation may pick
  (report/recommend.py: not sync none on more than one device, not flagged by the quality
  check); families with none such rank after them, on their best ok configuration, then
  families with no ok run at all.
- Ties keep the grid's order (analysis/configs.py), so the ranking is stable.

build.py ranks once (`Report.ranking`) and orders the curves and diagnoses by it; the overview
(sections.py, render_html.py) and the terminal's short view (brief.py) read it.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amdahl.analysis.configs import Config
from amdahl.analysis.scaling import Curve
from amdahl.analysis.stats import Stat
from amdahl.search.objectives import describe, objective_value

OBJECTIVES = ("throughput", "throughput_per_device", "time_to_target")
#: What each objective ranks by, as the overview's column header says it.
OBJECTIVE_TEXT = {
    "throughput": "throughput (samples/s)",
    "throughput_per_device": "throughput per device (samples/s/device)",
    "time_to_target": "time to target (s, shortest first)",
}


def sweep_objective(spec: dict[str, Any] | None, rows: list[dict[str, Any]]) -> str:
    """The objective the report ranks by (see the module docstring); `spec`: spec.yaml as read."""
    search = (spec or {}).get("search")
    spec_objective = search.get("objective") if isinstance(search, dict) else None
    if spec_objective in OBJECTIVES and spec_objective != "throughput":
        return spec_objective
    if any(r.get("target") for r in rows):
        return "time_to_target"
    return "throughput"


def config_value(c: Config, objective: str) -> float | None:
    """The median of the configuration's ok repeats' objective (higher is better), or None."""
    s = Stat.of(objective_value(r, objective) for r in c.ok_rows)
    return s.median if s else None


def config_status(c: Config) -> str:
    """`ok`, or what its runs ended as: `oom`, `2 ok, 1 diverged`."""
    counts: dict[str, int] = {}
    for r in c.rows:
        status = r.get("status") or "unknown"
        counts[status] = counts.get(status, 0) + 1
    if list(counts) in (["ok"], []):
        return "ok"
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{n} {s}" for s, n in counts.items())


@dataclass
class Family:
    """Every device count of one grid point: its configurations (every status, by devices),
    its scaling curve (None without ok runs), and the configuration it ranks by."""

    label: str
    configs: list[Config]
    curve: Curve | None = None
    best: Config | None = None
    value: float | None = None
    #: The best may be recommended (else it is a sync none ceiling or flagged, or nothing ran).
    eligible: bool = False

    def at(self, devices: int) -> Config | None:
        return next((c for c in self.configs if c.devices == devices), None)

    @property
    def status(self) -> str:
        """`ok`, or the device counts whose runs were not all ok: `d2 oom`."""
        bad = [(c.devices, config_status(c)) for c in self.configs]
        bad = [(p, s) for p, s in bad if s != "ok"]
        return "ok" if not bad else "; ".join(f"d{p} {s}" for p, s in bad)

    @property
    def efficiency(self) -> tuple[int, float] | None:
        """(p, S/p) at the largest device count the curve measured beyond one."""
        pts = [p for p in (self.curve.points if self.curve else []) if p.efficiency is not None]
        pts = [p for p in pts if p.devices > 1]
        return (pts[-1].devices, pts[-1].efficiency) if pts else None


@dataclass
class Ranking:
    objective: str
    families: list[Family] = field(default_factory=list)
    _rank: dict[tuple, int] = field(default_factory=dict, init=False, repr=False)

    @property
    def devices(self) -> list[int]:
        """Every device count of the sweep, ascending (the overview's columns)."""
        return sorted({c.devices for f in self.families for c in f.configs})

    def describe(self, value: float | None) -> str:
        return "n/a" if value is None else describe(value, self.objective)

    def position(self, c: Config) -> tuple[int, int]:
        """Sort key of a configuration: its family's rank, then its device count."""
        return self._rank.get(c.curve_key, len(self.families)), c.devices

    def __post_init__(self) -> None:
        self._rank = {f.configs[0].curve_key: i for i, f in enumerate(self.families)}


def rank(
    configs: list[Config], curves: list[Curve], eligible: list[Config], objective: str
) -> Ranking:
    """Families of `configs` ranked by `objective` (`eligible`: the recommendation's)."""
    by_key: dict[tuple, list[Config]] = {}
    for c in configs:
        by_key.setdefault(c.curve_key, []).append(c)
    curve_of = {cv.key: cv for cv in curves}
    may_pick = {id(c) for c in eligible}
    families = []
    for key, members in by_key.items():
        members = sorted(members, key=lambda c: c.devices)
        fam = Family(members[0].label.split(" ", 1)[1], members, curve_of.get(key))
        scored = [(c, config_value(c, objective)) for c in members]
        scored = [(c, v) for c, v in scored if v is not None]
        picks = [(c, v) for c, v in scored if id(c) in may_pick]
        pool = picks or scored
        if pool:
            fam.best, fam.value = max(pool, key=lambda cv: cv[1])
            fam.eligible = bool(picks)
        families.append(fam)

    def order(f: Family) -> tuple:
        tier = 0 if f.eligible else 1 if f.value is not None else 2
        return (tier, -(f.value or 0.0))

    return Ranking(objective, sorted(families, key=order))  # stable: grid order on ties
