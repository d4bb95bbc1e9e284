"""Successive halving over a sweep's configurations (`search: {method: halving}`): the decisions.

Rung r measures every surviving configuration for `min_steps * eta**r` steps (the last rung for
`train.steps`); the best 1/eta go on to the next rung, together with any configuration that is not
measurably worse than the last one kept (its objective within two standard errors of the cutoff's:
from the spread between runs where the rung has repeats, `train.repeats` >= 2, else, said in the
reason, from the per-step times of one run, which see only the noise inside it). A configuration
that failed, or breaks a constraint, is dropped with the reason. The last rung measures each
finalist `final_repeats` times, interleaved, and ranks by the median; the finalists its spread
cannot tell apart from the best are named as tied (`indistinct`). Before the first rung's remaining
configurations run, the step-time model (analysis/stepmodel.py), fitted on each family's
configurations at its smallest device count, predicts the others; one whose prediction's 80%
interval (analysis/intervals.py) lies wholly below `skip_below` of the best measured objective, its
high end included, is recorded with status `skipped` and the prediction as its reason, never
silently dropped: a point below the line with the interval reaching above it is measured.

Every decision is a pure function of the results rows, so a resumed sweep and the report's "search"
section recompute the same rungs from results.parquet (`replay`). Pure: no Ray, no torch
(docs/architecture.md, "Search").
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from amdahl.search.objectives import Constraint, describe, objective_value
from amdahl.spec.schema import SearchSpec, TrainSpec

#: Relative standard error assumed for a row without per-step times to estimate its own.
DEFAULT_NOISE = 0.02
#: Standard errors within which a configuration is "not measurably worse" than the cutoff.
NOISE_SIGMAS = 2.0
OK = "ok"
SKIPPED = "skipped"


def relative_noise(row: dict[str, Any]) -> float:
    """Relative standard error of the row's mean step time, from its per-step history
    (measured steps only; the spread taken robustly, 1.4826 x the median absolute deviation,
    so that one stalled step does not make every configuration look indistinguishable);
    DEFAULT_NOISE when it has too few steps."""
    try:
        history = json.loads(row.get("history") or "{}")
    except ValueError:
        history = {}
    warm = int(row.get("warmup_steps") or 0)
    times = [
        t
        for s, t in zip(history.get("step", []), history.get("step_time_s", []), strict=False)
        if s > warm and t
    ]
    if len(times) < 3:
        return DEFAULT_NOISE
    mid = statistics.median(times)
    mad = statistics.median(abs(t - mid) for t in times)
    return 1.4826 * mad / mid / math.sqrt(len(times)) if mid > 0 else DEFAULT_NOISE


# --------------------------------------------------------------------------- rungs


def rung_steps(search: SearchSpec, train: TrainSpec) -> list[int]:
    """Measured steps of each rung: min_steps x eta^r, then train.steps (time-to-target: the
    steps cap, target.max_steps, instead). A geometric rung within sqrt(eta) of the full length
    is left out: it would measure the same survivors almost as long as the last rung does (300
    steps, eta 3: rungs 10, 30, 90, 300, not 10, 30, 90, 270, 300), so the last step up is
    between sqrt(eta) and eta x sqrt(eta)."""
    full = train.target.max_steps if train.target else train.steps
    steps, s = [], search.min_steps
    while s * math.sqrt(search.eta) < full:
        steps.append(s)
        s *= search.eta
    return [*steps, full]


def rung_repeats(search: SearchSpec, train: TrainSpec, rung: int) -> int:
    """Measurements of each configuration in rung `rung`: `train.repeats`, and in the last rung
    at least `search.final_repeats` (the final ranking's spread)."""
    last = rung >= len(rung_steps(search, train)) - 1
    return max(train.repeats, search.final_repeats) if last else train.repeats


#: Row columns only a full measurement fills: a ranking rung skips the passes that give them.
FULL_MEASUREMENT_COLUMNS = frozenset({"val_loss", "val_accuracy", "comm_s"})


def ranks_only(search: SearchSpec, train: TrainSpec, rung: int | None) -> bool:
    """Whether rung `rung`'s trials only rank configurations (every rung before the last).
    They then skip the validation pass and the exposed-communication calibration: on a short
    rung those cost as much as the measured window, and the ranking reads neither, unless the
    objective (time_to_target) or a constraint does."""
    if rung is None or rung >= len(rung_steps(search, train)) - 1:
        return False
    if search.objective == "time_to_target":
        return False
    columns = {Constraint.parse(c).column for c in search.constraints}
    return not columns & FULL_MEASUREMENT_COLUMNS


@dataclass
class Rung:
    """One rung's decisions."""

    index: int
    steps: int
    measured: list[str] = field(default_factory=list)  # trial ids, in ranking order
    kept: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # trial id -> why
    values: dict[str, float] = field(default_factory=dict)  # trial id -> objective (median)
    #: trial id -> the objective of each of its ok repeats in this rung
    repeats: dict[str, list[float]] = field(default_factory=dict)
    cutoff: float | None = None
    #: The last rung: the finalists that cannot be told apart from the best (`indistinct`).
    tied: list[str] = field(default_factory=list)
    #: The relative run-to-run standard deviation pooled over the rung's repeated
    #: configurations (`run_noise`); None where no configuration ran twice.
    run_sd: float | None = None


def _merged(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per trial id, one row: the first failing repeat's, else the repeat with the median
    objective (repeats measure the same configuration)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["trial_id"], []).append(r)
    out = {}
    for tid, rs in by.items():
        bad = [r for r in rs if r.get("status") != OK]
        if bad:
            out[tid] = bad[0]
            continue
        rs = sorted(rs, key=lambda r: r.get("throughput") or 0.0)
        out[tid] = rs[len(rs) // 2]
    return out


def _objectives(rows: list[dict[str, Any]], objective: str) -> dict[str, list[float]]:
    """Per trial id, the objective of each of its ok repeats."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r.get("status") == OK and (v := objective_value(r, objective)) is not None:
            out.setdefault(r["trial_id"], []).append(v)
    return out


def promote(
    rows: list[dict[str, Any]],
    index: int,
    steps: int,
    search: SearchSpec,
    last: bool = False,
) -> Rung:
    """Decide rung `index` from its rows: rank by the median of each configuration's repeats,
    keep the best 1/eta and everything not measurably worse than the last one kept, drop the
    rest with the reason. On the `last` rung nothing is dropped for rank: the survivors are the
    final ranking, and those that cannot be told apart from the best are `tied`."""
    rung = Rung(index, steps)
    constraints = [Constraint.parse(c) for c in search.constraints]
    objectives = _objectives(rows, search.objective)
    valid: list[tuple[float, str, dict[str, Any]]] = []
    for tid, row in _merged(rows).items():
        if row.get("status") != OK:
            rung.dropped[tid] = f"rung {index}: {row.get('status')}: " + _first_line(row)
            continue
        broken = next((why for c in constraints if (why := c.violation(row))), None)
        if broken or tid not in objectives:
            rung.dropped[tid] = f"rung {index}: " + (
                broken or f"no {search.objective} (target not reached in {steps} steps)"
            )
            continue
        valid.append((statistics.median(objectives[tid]), tid, row))
    valid.sort(key=lambda v: (-v[0], v[1]))
    rung.measured = [tid for _, tid, _ in valid]
    rung.values = {tid: v for v, tid, _ in valid}
    rung.repeats = {tid: sorted(objectives[tid]) for tid in rung.measured}
    if not valid:
        return rung
    if last:
        rung.kept = list(rung.measured)
        best = valid[0]
        rung.tied = [tid for v, tid, row in valid[1:] if indistinct(best, (v, tid, row), rung)]
        return rung
    n_keep = max(1, math.ceil(len(valid) / search.eta))
    cut_value, cut_tid, cut_row = valid[n_keep - 1]
    rung.cutoff = cut_value
    rung.run_sd = run_noise(rung.repeats)

    def se(value: float, tid: str, row: dict[str, Any]) -> float:
        if rung.run_sd is not None:
            return rung.run_sd * value / math.sqrt(len(rung.repeats[tid]))
        return relative_noise(row) * value

    cut_se = se(cut_value, cut_tid, cut_row)
    noise = (
        f"the spread between runs, {rung.run_sd:.1%} pooled over the rung's repeats"
        if rung.run_sd is not None
        else "one run's per-step times: no repeats, so the noise between runs is not measured"
    )
    for i, (value, tid, row) in enumerate(valid):
        band = NOISE_SIGMAS * math.hypot(se(value, tid, row), cut_se)
        if i < n_keep or cut_value - value <= band:
            rung.kept.append(tid)
        else:
            cutoff = describe(cut_value, search.objective)
            rung.dropped[tid] = (
                f"rung {index} ({steps} steps): {describe(value, search.objective)}, "
                f"{cut_value / value:.2f}x below the cutoff {cutoff} (best 1/{search.eta} of "
                f"{len(valid)}; beyond {NOISE_SIGMAS:g} standard errors, from {noise})"
            )
    return rung


def run_noise(repeats: dict[str, list[float]]) -> float | None:
    """The relative standard deviation between runs of one configuration, pooled over every
    configuration measured at least twice (the median of their stdev / mean): what a decision
    between two configurations' runs must see past. One run's per-step times see only the
    noise inside its window (step noise averages out there; the process's placement, caches
    and the box's other load between runs do not). None where no configuration ran twice."""
    sds = [
        statistics.stdev(v) / statistics.mean(v)
        for v in repeats.values()
        if len(v) >= 2 and statistics.mean(v) > 0
    ]
    return statistics.median(sds) if sds else None


def indistinct(
    best: tuple[float, str, dict[str, Any]], other: tuple[float, str, dict[str, Any]], rung: Rung
) -> bool:
    """Whether `other` (value, trial id, median row) cannot be told apart from `best`. Where
    repeats give a spread: their medians differ by no more than the wider of the two ranges
    (the report's rule for "no measurable difference", analysis.stats.differs). With one run
    each: within NOISE_SIGMAS standard errors of the per-step times, which sees only the noise
    inside one run, not between runs, so the summary and report say how many runs there were."""
    (b_value, b_tid, b_row), (value, tid, row) = best, other
    b_spread, spread = (max(rung.repeats[t]) - min(rung.repeats[t]) for t in (b_tid, tid))
    if b_spread or spread:  # a spread over repeats on at least one side
        return b_value - value <= max(b_spread, spread)
    band = NOISE_SIGMAS * math.hypot(relative_noise(b_row) * b_value, relative_noise(row) * value)
    return b_value - value <= band


def trim_to_budget(
    rung: Rung, rows: list[dict[str, Any]], next_steps: int, left_s: float | None
) -> float:
    """Keep only as many of the rung's survivors, best first, as the budget left can measure
    at the next rung (each dropped one gets the reason); returns the estimated seconds."""
    by = _merged(rows)
    total = 0.0
    kept = []
    for tid in rung.kept:
        cost = estimate_s(by[tid], next_steps)
        if left_s is not None and total + cost > left_s:
            rung.dropped[tid] = (
                f"rung {rung.index}: budget: measuring it for {next_steps} steps (~{cost:.1f} s) "
                f"would pass search.budget ({left_s:.0f} s left)"
            )
            continue
        kept.append(tid)
        total += cost
    rung.kept = kept
    return total


def estimate_s(row: dict[str, Any], steps: int) -> float:
    """Trial-seconds a configuration would take for `steps` measured steps, from one row of
    it: the row's seconds outside its window plus the window scaled to `steps`. A continued
    row's `measured_s` pools its earlier windows: its own window is `item_measured_s`. (A
    configuration that continues pays less than this: only the steps its rung adds.)"""
    wall = float(row.get("wall_s") or 0.0)
    measured = float(row.get("measured_s") or 0.0)
    own = float(row.get("item_measured_s") or measured)
    done = int(row.get("steps") or 0) or 1
    return max(0.0, wall - own) + measured * steps / done


def spent_s(rows: list[dict[str, Any]]) -> float:
    """Trial-seconds the rows took (what search.budget counts)."""
    return sum(float(r.get("wall_s") or 0.0) for r in rows if r.get("status") != SKIPPED)


def grid_estimate_s(first_rung: list[dict[str, Any]], n_configs: int, full_steps: int) -> float:
    """The whole grid's trial-seconds at full length, estimated from the first rung's rows
    (configurations it did not measure count as the median measured one)."""
    by = _merged([r for r in first_rung if r.get("status") == OK])
    costs = [estimate_s(r, full_steps) for r in by.values()]
    if not costs:
        return 0.0
    return sum(costs) + statistics.median(costs) * max(0, n_configs - len(costs))


def _first_line(row: dict[str, Any]) -> str:
    return (row.get("error") or "").splitlines()[0] if row.get("error") else ""


# --------------------------------------------------------------------------- replay


@dataclass
class SearchState:
    """Where a halving search stands, recomputed from its results rows."""

    rungs: list[Rung]
    skipped: dict[str, str]  # trial id -> the prediction that skipped it
    steps: list[int]

    @property
    def finished(self) -> bool:
        return bool(self.rungs) and (
            self.rungs[-1].index == len(self.steps) - 1 or not self.rungs[-1].kept
        )

    def ranking(self) -> list[tuple[str, int, float]]:
        """(trial id, rung reached, objective there), best first: deepest rung first."""
        seen: set[str] = set()
        out = []
        for rung in reversed(self.rungs):
            for tid in rung.measured:
                if tid not in seen:
                    seen.add(tid)
                    out.append((tid, rung.index, rung.values[tid]))
        return out


#: What a compiled configuration's first rung paid and a later rung that reloaded its graphs
#: (`compile_cache: own`, worker/compile_dirs.py) did not: the configuration's figures.
FIRST_RUNG_FIGURES = ("compile_s", "warmup_s", "first_step_s")


def final_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each (trial, repeat)'s row of the last rung it reached (its longest measurement);
    skipped configurations have none. Rows without a rung (a grid sweep) are kept as they are.
    Where that row reloaded its configuration's compiled graphs, its compile figures are the
    first rung's (what compiling it costs), the compile_cache the first rung's too."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    first: dict[tuple[str, int], dict[str, Any]] = {}
    out = []
    for r in rows:
        if r.get("status") == SKIPPED:
            continue
        if r.get("rung") is None:
            out.append(r)
            continue
        key = (r["trial_id"], r["repeat"])
        if key not in best or r["rung"] > best[key]["rung"]:
            best[key] = r
        if r.get("status") == "ok" and (key not in first or r["rung"] < first[key]["rung"]):
            first[key] = r
    for key, r in best.items():
        start = first.get(key)
        if r.get("compile_cache") == "own" and start is not None and start is not r:
            figures = {k: start.get(k) for k in (*FIRST_RUNG_FIGURES, "compile_cache")}
            best[key] = {**r, **figures}
    return out + list(best.values())


def rows_by_rung(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("rung") is not None and r.get("status") != SKIPPED:
            out.setdefault(int(r["rung"]), []).append(r)
    return out


def replay(rows: list[dict[str, Any]], search: SearchSpec, train: TrainSpec) -> SearchState:
    """Every completed rung's decisions from the rows (a rung is complete when each trial the
    previous rung kept has a row in it for every repeat, `rung_repeats`). The budget trims of
    the live run are recomputed with the trial-seconds the rows record."""
    steps = rung_steps(search, train)
    by_rung = rows_by_rung(rows)
    skipped = {r["trial_id"]: r.get("error") or "" for r in rows if r.get("status") == SKIPPED}
    state = SearchState([], skipped, steps)
    expected: set[str] | None = None
    spent = 0.0
    limit = None
    for index, n_steps in enumerate(steps):
        these = by_rung.get(index, [])
        ids = {r["trial_id"] for r in these}
        runs = {(r["trial_id"], r["repeat"]) for r in these}
        repeats = range(rung_repeats(search, train, index))
        if not these or (
            expected is not None and not {(t, k) for t in expected for k in repeats} <= runs
        ):
            break
        spent += spent_s(these)
        if index == 0:
            limit = search.budget_s(grid_estimate_s(these, len(ids) + len(skipped), steps[-1]))
        last = index == len(steps) - 1
        rung = promote(these, index, n_steps, search, last=last)
        if not last:
            trim_to_budget(rung, these, steps[index + 1], None if limit is None else limit - spent)
        state.rungs.append(rung)
        expected = set(rung.kept)
        if not rung.kept:
            break
    return state


# --------------------------------------------------------------------------- model skips


def anchor_trials(candidates: list[dict[str, Any]]) -> list[str]:
    """The first rung's configurations measured before the model predicts the rest: those at
    their family's smallest device count (what the model's compute line is fitted from)."""
    from amdahl.analysis.points import family_key

    smallest: dict[tuple, int] = {}
    for c in candidates:
        key = family_key(c)
        smallest[key] = min(smallest.get(key, c["devices"]), c["devices"])
    return [c["trial_id"] for c in candidates if c["devices"] == smallest[family_key(c)]]


def predicted_skips(
    measured: list[dict[str, Any]],
    candidates: list[dict[str, Any]],
    search: SearchSpec,
    options: dict[str, Any],
    calibration: dict[str, Any] | None,
) -> dict[str, str]:
    """Trial ids of `candidates` (row-shaped settings, not yet measured) whose objective, by
    the step-time model fitted on the `measured` rows, stays below `skip_below` of the best
    measured one at the high end of the prediction's 80% interval, with the prediction as the
    reason. Candidates it cannot predict (no compute line, no communication model) are never
    skipped."""
    from amdahl.analysis.calibration import Calibration
    from amdahl.analysis.comm import options_from_mapping
    from amdahl.analysis.configs import group_configs
    from amdahl.analysis.intervals import evidence_of, extrapolated_band
    from amdahl.analysis.selfcheck import extrapolation_checks, leave_one_out
    from amdahl.analysis.stepmodel import ModelInputs, fit

    if search.skip_below is None or search.objective == "time_to_target":
        return {}
    values = [v for r in measured if (v := objective_value(r, search.objective)) is not None]
    if not values:
        return {}
    best = max(values)
    # Grouped together, so that candidates get the settings their measured siblings get.
    pending = [{**c, "status": "pending"} for c in candidates]
    configs = group_configs([*measured, *pending])
    inputs = ModelInputs(
        configs=configs,
        calibration=Calibration.from_dict(calibration) if calibration else None,
        options=options_from_mapping({"options": options}),
    )
    model = fit(inputs)
    evidence = evidence_of(inputs, leave_one_out(inputs), extrapolation_checks(inputs))
    by_id = {c["trial_id"]: c for c in candidates}
    points = inputs.points()
    out = {}
    for config in configs:
        if not all(r.get("status") == "pending" for r in config.rows):
            continue
        family = model.family_of(config)
        if family is None:
            continue
        c = by_id[config.rows[0]["trial_id"]]
        p = model.predict(family, c["devices"], float(c["batch_size"]))
        if p.throughput is None:
            continue
        # the regime and the communication law's alternative widen it as in `platform predict`
        band = extrapolated_band(model, family, points, p, float(c["batch_size"]), 1, evidence).band
        if band is None:
            continue
        ends = [
            objective_value({**c, "throughput": x}, search.objective)
            for x in (p.throughput, band.low, band.high)
        ]
        if any(v is None for v in ends):
            continue
        value, high = ends[0], max(ends[1:])
        if high < search.skip_below * best:
            out[c["trial_id"]] = (
                f"predicted {describe(value, search.objective)} by the step-time model (compute "
                f"{p.compute_s * 1e3:.2f} ms + communication {(p.comm_s or 0) * 1e3:.2f} ms per "
                f"step; 80% interval up to {describe(high, search.objective)}: "
                f"{band.basis}), below {search.skip_below:g} x the best measured "
                f"{describe(best, search.objective)} even at the interval's high end"
            )
    return out
