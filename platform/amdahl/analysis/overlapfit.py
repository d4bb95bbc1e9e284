"""The step-time model's overlap terms (analysis/stepmodel.py): gamma, Pollux's exponent that
combines compute and communication, and theta, what a strategy's communication costs against the
calibrated collective, fitted together per sync strategy; where the points cannot separate them,
theta stays at its prior (`separable`).

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from amdahl.analysis.computefit import BoundHit
from amdahl.analysis.stats import minimize_scalar

GAMMA_RANGE = (1.0, 8.0)
THETA_RANGE = (0.25, 16.0)
#: Weight of (log theta)^2 in the overlap fit: small against a point's squared log error, enough
#: to pick theta near 1 where gamma and theta trade off on too few points.
THETA_PRIOR = 0.01


def combine(compute: float, comm: float, gamma: float) -> float:
    """(T_c^gamma + T_n^gamma)^(1/gamma): gamma 1 adds them (no overlap), large gamma tends to
    the larger of the two (full overlap). Scaled by the larger term to stay in range."""
    m = max(compute, comm)
    if m <= 0:
        return 0.0
    return m * ((compute / m) ** gamma + (comm / m) ** gamma) ** (1.0 / gamma)


@functools.lru_cache(maxsize=1024)
def fit_overlap(
    obs: tuple[tuple[float, float, float], ...], no_overlap: str = ""
) -> tuple[float, float, str]:
    """(gamma, theta, note) for observations (compute, calibrated comm, measured busy step).

    `no_overlap`: why the strategy cannot overlap its communication with compute (one DDP
    bucket: its all-reduce starts when the backward ends), or "": then gamma is 1, known,
    and theta is fitted alone. Else, where the points cannot separate the two (`separable`):
    theta, when it is the loose one, is fixed at the value nearest its prior 1 (the calibrated
    collective, a measurement) among those that fit, and gamma fitted alone; gamma loose alone
    is left as fitted (the points barely depend on it). The note says which. Cached: a
    leave-one-out refit changes one strategy's points only."""

    def sse(gamma: float, theta: float) -> float:
        return sum(math.log(combine(c, theta * n, gamma) / t) ** 2 for c, n, t in obs)

    def cost_at(gamma: float, theta: float) -> float:
        return sse(gamma, theta) + THETA_PRIOR * math.log(theta) ** 2

    if no_overlap:  # gamma known: theta alone
        theta = minimize_scalar(lambda t: cost_at(1.0, t), *THETA_RANGE, log=True)
        return 1.0, theta, f"gamma 1: {no_overlap}"

    def best_gamma(theta: float) -> float:
        return minimize_scalar(lambda g: sse(g, theta), *GAMMA_RANGE)

    def cost(theta: float) -> float:
        return cost_at(best_gamma(theta), theta)

    theta = minimize_scalar(cost, *THETA_RANGE, log=True)
    gamma = best_gamma(theta)
    loose = separable(sse, gamma, theta, len(obs))
    if loose.theta is not None:
        lo, hi = loose.theta
        fixed = min(max(1.0, lo), hi)
        where = "its prior 1" if fixed == 1.0 else f"{fixed:.3g}, the nearest its prior 1"
        return (
            best_gamma(fixed),
            fixed,
            f"gamma and theta not separable on {len(obs)} point(s) (theta {lo:.3g}-{hi:.3g} "
            f"fit alike): theta fixed at {where}, gamma fitted alone",
        )
    if loose.gamma:
        return (
            gamma,
            theta,
            f"gamma not pinned by {len(obs)} point(s): the steps barely depend on it",
        )
    return gamma, theta, ""


#: Per point, the squared log error within which two fits describe the points equally well
#: (a 2% step error: below the run-to-run noise of the measured steps).
SEPARABLE_NOISE = 0.02**2
#: theta is pinned when the thetas that fit equally well span at most this factor; gamma when
#: they span at most this much of its value.
THETA_PINNED, GAMMA_PINNED = 1.5, 1.0


@dataclass(frozen=True)
class Looseness:
    """What the points leave loose: theta's range that fits alike (None: pinned), and whether
    gamma is loose."""

    theta: tuple[float, float] | None
    gamma: bool


def separable(sse: Any, gamma: float, theta: float, points: int) -> Looseness:
    """Each parameter's profile (the other at its best on a grid) scanned over its range: the
    values that fit within SEPARABLE_NOISE per point of the best fit span its uncertainty; more
    than a factor THETA_PINNED for theta, more than GAMMA_PINNED for gamma, is loose."""
    floor = sse(gamma, theta) + SEPARABLE_NOISE * points
    t_lo, t_hi = (math.log(v) for v in THETA_RANGE)
    thetas = [math.exp(t_lo + (t_hi - t_lo) * i / 48) for i in range(49)]
    gammas = [GAMMA_RANGE[0] + (GAMMA_RANGE[1] - GAMMA_RANGE[0]) * i / 28 for i in range(29)]
    fit_t = [t for t in thetas if min(sse(g, t) for g in gammas) <= floor] or [theta]
    fit_g = [g for g in gammas if min(sse(g, t) for t in thetas) <= floor] or [gamma]
    span = (min(fit_t), max(fit_t))
    return Looseness(
        span if span[1] / span[0] > THETA_PINNED else None,
        max(fit_g) - min(fit_g) > GAMMA_PINNED,
    )


def theta_hit(theta: float, side: str) -> BoundHit:
    lo, hi = THETA_RANGE
    if side == "lower":
        meaning = (
            f"the strategy's communication would cost {lo:g}x the calibrated collective or "
            "less: calibration.json's alpha and B do not describe the links these trials used"
        )
        return BoundHit("theta", theta, lo, side, meaning, "communication")
    meaning = (
        f"the strategy's communication would cost {hi:g}x the calibrated collective or more: "
        "the wire formula (bytes, latency terms) misses most of its cost, or the calibration "
        "is far faster than the trials' links"
    )
    return BoundHit("theta", theta, hi, side, meaning, "communication")
