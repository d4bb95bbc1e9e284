"""The step-time model's compute term, fitted from what compute is, and the rule that a fitted
parameter on a bound is a failed fit (docs/architecture.md, "The step-time model").

Compute is what a worker does with no communication at all: the `sync: none` trials, at every
device count the sweep measured. Those give one compute line per device count,
T_c(b, p) = a_p + b_p * b, so hardware contention (workers sharing cores and memory bandwidth) is
measured at each p instead of assumed. A strategy's own 1-device trial is not compute alone: it
runs inside the strategy's wrapper (DDP's reducer, bucket copies and its 1-rank all-reduce on
one device), which on the 2-core laptop made it about 15% slower than the same computation
without it. That cost is a separate term, the wrapper's per-step seconds (omega), fitted as the
mean difference between the strategy's 1-device trials and the sync-none line at the same batch.

A bounded parameter whose fit lands on its bound did not find its value inside the range that
makes sense: the model does not describe the data there. Such a parameter is a `BoundHit`, named
with its bound and what the bound means; the model withholds the predictions that use it.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: A line's intercept or slope clamped at 0 is a failed fit only when the unconstrained value
#: lies beyond this share of the smallest observation (timer noise keeps near-0 values honest).
LINE_TOLERANCE = 0.02
#: A multiplicative parameter within this relative distance of a bound is on it.
BOUND_TOLERANCE = 0.01


@dataclass(frozen=True)
class BoundHit:
    """A fitted parameter on a bound of its range: a failed fit."""

    parameter: str  # "theta", "kappa", "a_c", "b_c", ...
    value: float
    bound: float
    side: str  # "lower" or "upper"
    meaning: str
    #: "compute": every prediction of the family uses it; "communication": only those that
    #: communicate; "contention": only those at a device count not measured (the contention
    #: model scales compute there).
    scope: str = "compute"
    where: str = ""  # whose fit it was, when borrowed ("sync none's")

    def short(self) -> str:
        owner = f"{self.where} " if self.where else ""
        return f"{owner}{self.parameter} = {self.value:.3g} at its {self.side} bound {self.bound:g}"

    def text(self) -> str:
        owner = f"{self.where} " if self.where else ""
        return (
            f"{owner}{self.parameter} = {self.value:.3g} at its {self.side} bound "
            f"{self.bound:g}: {self.meaning}"
        )


def on_bound(value: float, lo: float, hi: float) -> str | None:
    """ "lower" / "upper" when a multiplicative parameter fitted in [lo, hi] sits on a bound."""
    if value <= lo * (1 + BOUND_TOLERANCE):
        return "lower"
    if value >= hi * (1 - BOUND_TOLERANCE):
        return "upper"
    return None


@dataclass(frozen=True)
class Line:
    """T = a + b * x fitted on relative error, a >= 0 and b >= 0."""

    a: float
    b: float
    sse: float  # sum of squared relative errors
    hits: tuple[BoundHit, ...] = ()

    def at(self, x: float) -> float:
        return self.a + self.b * x


def fit_line(xs: Sequence[float], ys: Sequence[float], name: str = "a_c") -> Line:
    """Weighted least squares on relative error (weights 1/y^2), a >= 0 and b >= 0. A clamp is
    a BoundHit when the unconstrained value lies beyond LINE_TOLERANCE of the smallest y: the
    points are not on a line through positive values (compute not linear in the batch, or
    noise larger than the line's span). `name` names the intercept ("a_c", "a_2", ...)."""
    ws = [1.0 / (y * y) for y in ys]
    sw = sum(ws)
    sx = sum(w * x for w, x in zip(ws, xs, strict=True))
    sy = sum(w * y for w, y in zip(ws, ys, strict=True))
    sxx = sum(w * x * x for w, x in zip(ws, xs, strict=True))
    sxy = sum(w * x * y for w, x, y in zip(ws, xs, ys, strict=True))
    floor = LINE_TOLERANCE * min(ys)
    hits: list[BoundHit] = []
    det = sw * sxx - sx * sx
    if det > 1e-12 * sw * sxx:
        b = (sw * sxy - sx * sy) / det
        a = (sy - b * sx) / sw
    else:  # one batch size: proportional to it (a note, not a failed fit)
        a, b = 0.0, sxy / sxx
    if a < 0:
        if a < -floor:
            hits.append(
                BoundHit(
                    name,
                    a,
                    0.0,
                    "lower",
                    "the compute line through the measured batches would start below zero: "
                    "compute grows faster than linearly with the batch, or the points' noise "
                    "exceeds their span",
                )
            )
        a, b = 0.0, sxy / sxx
    if b < 0:
        if b * max(xs) < -floor:
            slope = "b_c" if name == "a_c" else "b" + name[1:]
            hits.append(
                BoundHit(
                    slope,
                    b,
                    0.0,
                    "lower",
                    "compute would fall as the batch grows: the points are noise, not a line",
                )
            )
        a, b = sy / sw, 0.0
    sse = sum(((a + b * x) / y - 1.0) ** 2 for x, y in zip(xs, ys, strict=True))
    return Line(a, b, sse, tuple(hits))


def fit_wrapper(xs: Sequence[float], ys: Sequence[float], base: Callable[[float], float]) -> float:
    """The wrapper's per-step seconds: the weighted mean (1/y^2, as the line) of y - base(x)
    over a strategy's 1-device trials, base being the no-wrapper compute line. Not bounded: a
    negative value (the wrapped run faster than the unwrapped one) is reported as it is."""
    ws = [1.0 / (y * y) for y in ys]
    return sum(w * (y - base(x)) for w, x, y in zip(ws, xs, ys, strict=True)) / sum(ws)


@dataclass
class Lines:
    """The compute lines of one family: the 1-device line and one per measured p > 1."""

    one: Line | None = None
    by_devices: dict[int, tuple[float, float]] | None = None  # p > 1 -> (a, b)
    notes: tuple[str, ...] = ()
    hits: tuple[BoundHit, ...] = ()
    #: The measured contention at the largest p: compute there / at 1 device, at `at_batch`.
    kappa: float = 1.0
    kappa_devices: int = 1
    at_batch: float = 0.0


def fit_lines(obs: dict[int, list[tuple[float, float]]]) -> Lines:
    """Compute lines from no-communication observations {devices: [(per-device batch, s)]}:
    the 1-device line, then at each p > 1 its own line where it has two batch sizes or more,
    else the 1-device line scaled by that p's measured ratio."""
    out = Lines(by_devices={})
    if not obs.get(1):
        return out
    xs, ys = zip(*obs[1], strict=True)
    out.one = fit_line(xs, ys, "a_c")
    hits, notes = list(out.one.hits), []
    if len(set(xs)) < 2:
        notes.append("compute measured at one batch size only: taken proportional to it")
    for p in sorted(q for q in obs if q > 1 and obs[q]):
        pxs, pys = zip(*obs[p], strict=True)
        if len(set(pxs)) >= 2:
            line = fit_line(pxs, pys, f"a_{p}")
            hits += line.hits
            out.by_devices[p] = (line.a, line.b)
        else:
            k = sum(y / out.one.at(x) for x, y in obs[p]) / len(obs[p])
            out.by_devices[p] = (out.one.a * k, out.one.b * k)
            notes.append(
                f"compute at {p} devices measured at one batch size: the 1-device line x {k:.2f}"
            )
    if out.by_devices:
        p = max(out.by_devices)
        out.at_batch = sorted(x for x, _ in obs[p])[len(obs[p]) // 2]
        a, b = out.by_devices[p]
        out.kappa = (a + b * out.at_batch) / out.one.at(out.at_batch)
        out.kappa_devices = p
    out.notes, out.hits = tuple(notes), tuple(hits)
    return out


def nearest_devices(measured: Sequence[int], devices: int) -> int | None:
    """The measured device count whose compute line stands in for `devices`: itself, else the
    largest measured below it, else the smallest above it."""
    if not measured:
        return None
    below = [p for p in measured if p <= devices]
    return max(below) if below else min(measured)
