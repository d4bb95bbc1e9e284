"""Numbers every analysis shares: a figure over repeats with its spread (`Stat`), the ratio and
the "measurable difference" of two such figures, the finite-number test, and the one-dimensional
minimiser the fits use.

Every figure the report prints is a `Stat` over a configuration's repeats, so every number keeps
its spread. Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


def is_number(v: Any) -> bool:
    """A finite int or float (not a bool, None, NaN or inf): a value a figure can be made of."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Stat:
    """A figure over repeats: median, range (lo..hi), count, coefficient of variation."""

    median: float
    lo: float
    hi: float
    n: int
    cv: float = 0.0

    @classmethod
    def of(cls, values: Iterable[Any]) -> Stat | None:
        """From raw values; None, NaN and inf are skipped; None when nothing is left."""
        xs = [float(v) for v in values if is_number(v)]
        if not xs:
            return None
        mean = statistics.fmean(xs)
        cv = statistics.stdev(xs) / abs(mean) if len(xs) > 1 and mean else 0.0
        return cls(statistics.median(xs), min(xs), max(xs), len(xs), cv)

    @property
    def spread(self) -> float:
        """max - min over the repeats (0 with one repeat: unknown, not zero noise)."""
        return self.hi - self.lo

    @property
    def rel_spread(self) -> float:
        return self.spread / abs(self.median) if self.median else 0.0

    @property
    def rel_se_median(self) -> float | None:
        """The median's standard error relative to it: sqrt(pi/2) x sd / sqrt(n), the large-n
        figure for roughly normal repeats (small n understates it); None with one repeat. What
        a prediction's error is compared with: a miss within it is as close as the
        measurement allows."""
        if self.n < 2:
            return None
        return math.sqrt(math.pi / 2) * self.cv / math.sqrt(self.n)

    def scale(self, k: float) -> Stat:
        lo, hi = sorted((self.lo * k, self.hi * k))
        return Stat(self.median * k, lo, hi, self.n, self.cv)

    def inverse(self) -> Stat:
        """1/x, with the range flipped (lo of 1/x comes from hi of x)."""
        return Stat(1 / self.median, 1 / self.hi, 1 / self.lo, self.n, self.cv)


def ratio(a: Stat, b: Stat) -> Stat:
    """a / b with its worst-case range: lo = a.lo / b.hi, hi = a.hi / b.lo."""
    return Stat(
        a.median / b.median,
        a.lo / b.hi,
        a.hi / b.lo,
        min(a.n, b.n),
        math.hypot(a.cv, b.cv),
    )


def differs(a: Stat, b: Stat) -> bool:
    """True when the medians differ by more than the larger spread; otherwise the report says
    "no measurable difference". With one repeat each, the spread is 0 and any difference counts
    (the report says so)."""
    return abs(a.median - b.median) > max(a.spread, b.spread)


def minimize_scalar(
    f: Callable[[float], float],
    lo: float,
    hi: float,
    *,
    log: bool = False,
    grid: int = 28,
    iterations: int = 30,
) -> float:
    """The x in [lo, hi] that minimises f: the best of `grid` + 1 evenly spaced points (spaced
    evenly in log x with `log`), then `iterations` golden-section steps between its neighbours;
    the grid point itself when the search ends no lower (a minimum at an end of the range)."""
    to = math.log if log else (lambda v: v)
    back = math.exp if log else (lambda v: v)
    a0, b0 = to(lo), to(hi)
    xs = [a0 + (b0 - a0) * i / grid for i in range(grid + 1)]
    vals = [f(back(x)) for x in xs]
    i = min(range(grid + 1), key=vals.__getitem__)
    a, b = xs[max(i - 1, 0)], xs[min(i + 1, grid)]
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(back(c)), f(back(d))
    for _ in range(iterations):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(back(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(back(d))
    x = (a + b) / 2
    return back(x) if f(back(x)) <= vals[i] else back(xs[i])
