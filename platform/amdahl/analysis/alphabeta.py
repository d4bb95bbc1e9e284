"""The interconnect's alpha-beta model: the ring all-reduce time it predicts, the bus bandwidth
nccl-tests reports, and the fit of alpha (latency) and beta (1 / bandwidth) to the all-reduce
times `platform calibrate` measures.

- Ring all-reduce: t = 2(p-1) alpha + 2(p-1)/p * bytes / bandwidth (nccl-tests PERFORMANCE.md);
  bus bandwidth = bytes / t * 2(p-1)/p.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def ring_allreduce_s(p: int, nbytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """Ring all-reduce time 2(p-1) alpha + 2(p-1)/p * bytes / bandwidth (nccl-tests
    PERFORMANCE.md); 0 for one device."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * nbytes / bandwidth_Bps


def bus_bandwidth(p: int, nbytes: float, seconds: float) -> float:
    """nccl-tests bus bandwidth of an all-reduce: algorithm bandwidth * 2(p-1)/p."""
    return nbytes / seconds * 2 * (p - 1) / p


@dataclass(frozen=True)
class AlphaBeta:
    alpha_s: float  # latency per ring step
    bandwidth_Bps: float  # 1 / beta
    rel_rmse: float  # fit quality: RMS relative error of the predicted times


#: The bandwidth term is fitted on the sizes at or above this fraction of the largest one.
LARGE_FRACTION = 1 / 64
#: The latency term is read off the sizes at or below this many bytes.
SMALL_BYTES = 64 * 1024


def fit_alpha_beta(p: int, sizes: list[float], seconds: list[float]) -> AlphaBeta:
    """Fit alpha and beta of the ring model to measured all-reduce times: the bandwidth from
    the large messages, the latency from the small ones.

    t = a + b * n with a = 2(p-1) alpha and b = 2(p-1)/p * beta. Measured times are not one
    straight line over six decades of sizes: NCCL switches protocol and channel count with the
    message size (a low-latency protocol for small messages, its bulk protocol only for large
    ones), so the slope at kilobytes is not the link's. One least-squares line through every size
    lets the many small sizes set the slope and underestimates the bandwidth a gradient of
    hundreds of MB sees. So the two terms are fitted where each one dominates:

    - b: ordinary least squares of t = c + b * n on the sizes >= LARGE_FRACTION x the largest
      (>= 8 MiB when the sizes reach 512 MiB; the two largest sizes if fewer qualify), on
      absolute times, so the largest messages, the size of a model's gradients, fix the slope;
      the intercept c (the bulk protocol's own start-up) is not the latency and is dropped.
    - a: the median of t - b * n over the sizes <= SMALL_BYTES (the smallest size if none is),
      where the time is almost all latency.

    The model then leaves out the bulk protocol's start-up beyond a, a few microseconds per
    ring step: a few percent of a 100 MB all-reduce over NVLink, where a slope set by the small
    sizes was off by tens of percent.

    rel_rmse is the RMS relative error of the two-term model over every size, protocol switches
    included. Needs p >= 2 and two or more sizes.
    """
    if p < 2:
        raise ValueError("an all-reduce over one device moves nothing; calibrate with p >= 2")
    pts = sorted((float(n), float(t)) for n, t in zip(sizes, seconds, strict=True) if t > 0)
    distinct = sorted({n for n, _ in pts})
    if len(distinct) < 2:
        raise ValueError("need at least two message sizes to separate latency from bandwidth")
    cut = min(distinct[-1] * LARGE_FRACTION, distinct[-2])
    large = [(n, t) for n, t in pts if n >= cut]
    mn = statistics.fmean(n for n, _ in large)
    mt = statistics.fmean(t for _, t in large)
    b = sum((n - mn) * (t - mt) for n, t in large) / sum((n - mn) ** 2 for n, _ in large)
    if b <= 0:
        raise ValueError("all-reduce time does not grow with message size; add larger sizes")
    small = [(n, t) for n, t in pts if n <= SMALL_BYTES] or [pts[0]]
    a = max(0.0, statistics.median(t - b * n for n, t in small))
    rel = [(a + b * n - t) / t for n, t in pts]
    return AlphaBeta(
        alpha_s=a / (2 * (p - 1)),
        bandwidth_Bps=2 * (p - 1) / p / b,
        rel_rmse=math.sqrt(statistics.fmean(r * r for r in rel)),
    )
