"""Contention between the ranks of one node for its host cores: the compute term of the
step-time model at device counts the sweep did not measure (docs/architecture.md, "The step-time
model").

A rank's step is, to its host, two kinds of time: host work (the Python loop, the input
pipeline, kernel launches, on CPU training the arithmetic itself), `demand_s` CPU seconds per
step, and time it needs no core for (kernels running on the device, a simulated device's
sleeps), `think_s`. p ranks on a node with C cores are a closed queueing network: p customers,
each alternating a delay of `think_s` and a visit to a C-server processor-sharing station that
serves `demand_s` (the machine-repairman model). Mean-value analysis gives its step time exactly,
and for processor sharing the answer does not depend on how the demand is distributed (BCMP): so

    step(p) = think_s + R(p),  R the CPU residence time mean-value analysis gives,

which is think + demand while the node has cores to spare and tends to p x demand / C once its
cores are the bottleneck, with the queueing between the two that makes 8 ranks on 2 cores
slower well before 8 x demand reaches 2 cores.

The same queueing stretches host-side communication: a second of CPU work among p ranks takes
R(p) / demand seconds (`inflation`), and gloo's ring steps are CPU work (the step-time model
multiplies its gloo communication term by it; NCCL's collectives run on the devices). Where the
calibration measured gloo above the node's cores, the link there holds that queueing already
(analysis/comm.py, `Oversubscribed`) and the model leaves the stretch out.

A rank is one customer served by at most one core at a time: a rank running several torch
threads has its share clamped at one core, and the fitted cores absorb the rest (its demand is
then partly fitted, not measured).

The demand is measured, not fitted: each 1-device trial's CPU busy share (`cpu_utilisation`, of
`host_cores` cores) times its step. Among more ranks the same work can take more CPU seconds
(memory bandwidth, shared caches, lower clocks): that is not queueing, and the rows tell the two
apart, because a rank waiting for a core spends no CPU time while it waits. So each measured
multi-device point's CPU seconds per step over the 1-device demand is its in-core factor
(`in_core`: 1.2-1.4 at 4 ranks of the D2L MLP on 16 cores, up to 1.6 at one batch, whose step
grew as much while every rank stayed on its core); the queueing model serves that larger
demand, and an unmeasured device count keeps the in-core factor of the measured one it is
scaled from. (Carrying it on as 1 + a ln p was tried and failed its first held-out test:
docs/performance-history.md, "The in-core factor carried beyond the measured counts".)

The time without a core can grow among more ranks too: a device's kernels waiting on memory or
a bus the node's ranks share (a simulated device's `in_core_slowdown`). No CPU figure sees it,
and queueing cannot explain it where the ranks leave cores idle, so it is its own term:
think(p) = think(1) x (1 + `growth` x (p - 1)), linear in the ranks sharing the node, as a
shared bandwidth's queue is once it is saturated (docs/performance-history.md, "Off-core
growth"). Fitted with the cores, at least 0 (more ranks never make a device faster), on each
point's typical step, not its window's (families._fit_contention: a straggler's constant is not
growth). What is
fitted, over the measured multi-device `sync: none` points, is the node's effective cores C:
the cores the ranks get, less what Ray, the driver and the OS take, with a weak prior at the
node's nominal cores
(where the measured device counts show no queueing, C stays there: nothing in the data says
otherwise). Without the in-core factor, that slowdown on 16 cores was fitted as 2.8 effective
cores, and 8-16 ranks were predicted 37-67% too slow.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from amdahl.analysis.computefit import BoundHit
from amdahl.analysis.stats import minimize_scalar

#: Effective cores are fitted within [nominal / CORES_SPAN, nominal x CORES_SPAN]; a fit on a
#: bound is a failed fit (the demand figures do not describe the slowdown).
CORES_SPAN = 8.0
#: Weight of log(C / nominal)^2 in the fit: small against a point's squared log error.
CORES_PRIOR = 0.01
#: The off-core growth per added rank is fitted within [0, GROWTH_MAX] (each added rank
#: doubling the device time is beyond any shared bus; a fit there is a failed fit), and only
#: where queueing alone leaves the widest measured count slower than the model by more than
#: GROWTH_EVIDENCE (mean log residual), or puts the cores on their lower bound: where the two
#: explain the rows alike (4 ranks on 2 cores whose CPU work queues), the queueing the CPU
#: figures measure is kept. A weak prior GROWTH_PRIOR x log(growth's factor there)^2 at none.
GROWTH_MAX = 1.0
GROWTH_EVIDENCE = 0.03
GROWTH_PRIOR = 0.01


def closed_step_s(ranks: int, think_s: float, demand_s: float, cores: float) -> float:
    """Mean step of `ranks` ranks sharing `cores` cores, each needing `demand_s` CPU seconds and
    `think_s` seconds without a core per step: exact mean-value analysis of the closed network
    (a delay station and a load-dependent processor-sharing station of rate min(j, cores))."""
    if ranks < 1 or demand_s <= 0:
        return think_s + max(demand_s, 0.0)
    probs = [1.0]  # probs[j]: j ranks at the CPU, in the network with one rank fewer
    residence = 0.0
    for n in range(1, ranks + 1):
        residence = sum(j / min(j, cores) * demand_s * probs[j - 1] for j in range(1, n + 1))
        x = n / (think_s + residence)
        nxt = [0.0] * (n + 1)
        for j in range(1, n + 1):
            nxt[j] = demand_s * x / min(j, cores) * probs[j - 1]
        nxt[0] = max(0.0, 1.0 - sum(nxt[1:]))
        probs = nxt
    return think_s + residence


@dataclass(frozen=True)
class HostShare:
    """A configuration's host demand at 1 device: the share of its compute step that is CPU
    work, per per-device batch (measured at those batches, interpolated between them)."""

    shares: tuple[tuple[float, float], ...]  # (per-device batch, CPU share of the step, 0..1)

    def at(self, batch: float) -> float:
        pts = self.shares
        if batch <= pts[0][0]:
            return pts[0][1]
        for (b0, s0), (b1, s1) in zip(pts, pts[1:], strict=False):
            if batch <= b1:
                return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)
        return pts[-1][1]


@dataclass(frozen=True)
class Contention:
    """The fitted model of one family: effective cores and the host share per batch."""

    cores: float  # effective cores the ranks of one node get
    nominal_cores: float
    share: HostShare
    points: int  # multi-device observations fitted on
    source: str
    on_bound: str | None = None  # "lower" / "upper" when the fitted cores sit on a bound
    #: (ranks per node, CPU seconds per step there / the 1-device demand), medians over the
    #: fitted points: the work's own slowdown among more ranks, apart from queueing
    in_core: tuple[tuple[int, float], ...] = ()
    #: The off-core time's growth per added rank on the node (think(p) = think(1) x
    #: `off_core_at(p)`), fitted with the cores; 0 where the rows show none.
    growth: float = 0.0
    growth_on_bound: bool = False

    def off_core_at(self, ranks: int) -> float:
        """How much longer a rank's time without a core is among `ranks` than alone."""
        return 1.0 + self.growth * (max(1, ranks) - 1)

    def in_core_at(self, ranks: int) -> float:
        """The in-core factor measured at the count nearest `ranks` (log scale, the larger on a
        tie); 1 for one rank, or where nothing was measured."""
        if ranks <= 1 or not self.in_core:
            return 1.0
        return min(self.in_core, key=lambda rk: (abs(math.log(rk[0] / ranks)), -rk[0]))[1]

    def step_s(
        self, one_device_s: float, batch: float, ranks_per_node: int, in_core: float = 1.0
    ) -> float:
        """Compute per step of one rank among `ranks_per_node`, from its 1-device compute, its
        CPU work `in_core` times the 1-device demand."""
        demand = self.share.at(batch) * one_device_s
        think = (one_device_s - demand) * self.off_core_at(ranks_per_node)
        return closed_step_s(ranks_per_node, think, demand * in_core, self.cores)

    def inflation(self, one_device_s: float, batch: float, ranks: int) -> float:
        """How much longer a second of CPU work takes among `ranks` ranks of a node than alone
        (the CPU residence over the demand, queueing alone): what host-side communication
        (gloo's ring steps, which need a core each) stretches by when the ranks' compute keeps
        the cores busy."""
        k = self.in_core_at(ranks)
        demand = self.share.at(batch) * one_device_s
        if demand <= 0:
            return 1.0
        think = (one_device_s - demand) * self.off_core_at(ranks)
        return (closed_step_s(ranks, think, demand * k, self.cores) - think) / (demand * k)

    def ratio(self, one_device_s: float, batch: float, ranks: int, from_ranks: int) -> float:
        """How much slower a rank's compute is among `ranks` ranks of a node than among
        `from_ranks` (measured there: its in-core factor carries over; queueing and the off-core
        growth change)."""
        k = self.in_core_at(from_ranks)
        base = self.step_s(one_device_s, batch, from_ranks, k)
        return self.step_s(one_device_s, batch, ranks, k) / base if base > 0 else 1.0

    def load(self, batch: float, ranks: int) -> float:
        """The share of the effective cores `ranks` ranks' CPU work keeps busy, queueing apart
        (ranks x share x in-core factor / cores)."""
        return ranks * self.share.at(batch) * self.in_core_at(ranks) / self.cores

    def load_caveat(self, batch: float, ranks: int) -> str:
        """Where `ranks` would load the cores beyond any measured count, and at least half of
        them: said, since the queueing there is extrapolated. The effective cores only show
        where the measured ranks load them: 2-4 ranks of the D2L MLP on 16 cores left them at
        the nominal 16, and gloo's all-reduce among 16 such ranks, which need their cores too,
        measured 2-3x the model's. Twice the most measured was once the threshold: then 8
        simulated ranks on 2 cores (load 0.8, the measured 4 ranks 0.4) passed as measured, and
        on three held-out sets 12 of their 18 8-rank points fell outside the interval
        (docs/performance-history.md, "The cores' load at 8 ranks")."""
        measured = max([self.load(batch, 1), *(self.load(batch, r) for r, _ in self.in_core)])
        target = self.load(batch, ranks)
        if target < 0.5 or target <= measured * (1 + 1e-9):
            return ""
        return (
            f"host cores: {ranks} ranks' CPU work would keep {min(target, 9.99):.0%} of the "
            f"node's {self.cores:.2g} effective cores busy, the measured ranks at most "
            f"{measured:.0%}: queueing for cores (and gloo's collectives with it) is extrapolated "
            "and can make this much slower; measure a device count nearer"
        )

    def bound_hit(self) -> BoundHit | None:
        """The fitted cores on a bound of their range as a failed fit (computefit's rule), or
        None; it withholds only the predictions that scale compute by contention."""
        if self.growth_on_bound:
            meaning = (
                "each added rank would double a rank's time off the cores: the measured compute "
                "grows faster than a shared device or bus explains (another bottleneck, or "
                "other load on the node)"
            )
            return BoundHit("growth", self.growth, GROWTH_MAX, "upper", meaning, "contention")
        if self.on_bound is None:
            return None
        fewer = self.on_bound == "lower"
        meaning = (
            "the ranks would get "
            + ("almost none of the node's cores" if fewer else "many times the node's cores")
            + ": their measured CPU share does not explain how compute changes with the device "
            "count (another bottleneck, such as memory bandwidth, or other load on the node)"
        )
        bound = cores_range(self.nominal_cores)[0 if fewer else 1]
        return BoundHit("cores", self.cores, bound, self.on_bound, meaning, "contention")

    def describe(self) -> str:
        lo, hi = min(s for _, s in self.share.shares), max(s for _, s in self.share.shares)
        share = f"{lo:.0%}" if math.isclose(lo, hi, abs_tol=0.005) else f"{lo:.0%}-{hi:.0%}"
        in_core = ", ".join(f"x{k:.2g} at {r}" for r, k in self.in_core if abs(k - 1) >= 0.05)
        if in_core:
            in_core = f"; CPU work per step {in_core} ranks, the nearest measured count's elsewhere"
        growth = ""
        if self.growth >= 0.005:
            growth = f"; time off the cores +{self.growth:.0%} per added rank on the node"
        return (
            f"host contention: {self.cores:.2g} effective cores of {self.nominal_cores:g} per "
            f"node, a rank's step {share} CPU work at 1 device{in_core}{growth} ({self.source})"
        )


def cores_range(nominal_cores: float) -> tuple[float, float]:
    """Where the effective cores are fitted: [nominal / CORES_SPAN, nominal x CORES_SPAN], but
    never below 1 core where the node has one (one rank alone must run as measured)."""
    return min(nominal_cores, max(1.0, nominal_cores / CORES_SPAN)), nominal_cores * CORES_SPAN


def fit_contention(
    share: HostShare,
    nominal_cores: float,
    one_device: Sequence[tuple[float, float]],
    observed: Sequence[tuple[int, float, float, float | None]],
) -> Contention:
    """Effective cores from observations (ranks per node, per-device batch, measured compute
    seconds, CPU seconds per step or None), against each batch's 1-device compute
    (`one_device`: (batch, seconds) of the 1-device line at the observed batches). Each
    observation's in-core factor is its CPU seconds (a core at most) over the 1-device demand,
    at least 1 (1 where not recorded). Without observations C is the nominal cores."""
    base = dict(one_device)
    obs = []
    for p, b, t, cpu_s in observed:
        if b not in base or t <= 0 or base[b] <= 0:
            continue
        demand = share.at(b) * base[b]
        k = max(1.0, min(cpu_s, t) / demand) if cpu_s and demand > 0 else 1.0
        obs.append((p, b, t, base[b], k))
    lo, hi = cores_range(nominal_cores)
    if not obs:
        return Contention(
            nominal_cores,
            nominal_cores,
            share,
            0,
            "no multi-device compute measured: nominal cores",
        )

    def cost(cores: float, growth: float) -> float:
        model = Contention(cores, nominal_cores, share, 0, "", growth=growth)
        err = sum(math.log(model.step_s(t1, b, p, k) / t) ** 2 for p, b, t, t1, k in obs)
        prior = CORES_PRIOR * math.log(cores / nominal_cores) ** 2
        prior += GROWTH_PRIOR * math.log(model.off_core_at(widest)) ** 2
        return err + prior

    widest = max(p for p, *_ in obs)

    def best_cores(growth: float) -> float:
        return minimize_scalar(lambda c: cost(c, growth), lo, hi, log=True)

    growth, cores = 0.0, best_cores(0.0)
    queued = Contention(cores, nominal_cores, share, 0, "")
    unexplained = statistics.fmean(
        math.log(t / queued.step_s(t1, b, p, k)) for p, b, t, t1, k in obs if p == widest
    )
    if widest > 1 and (unexplained > GROWTH_EVIDENCE or cores <= lo * 1.01):
        growth = minimize_scalar(lambda g: cost(best_cores(g), g), 0.0, GROWTH_MAX)
        cores = best_cores(growth)
    side = None
    if cores <= lo * 1.01:
        side = "lower"
    elif cores >= hi * 0.99:
        side = "upper"
    counts = sorted({p for p, *_ in obs})
    in_core = tuple((p, statistics.median(k for q, *_, k in obs if q == p)) for p in counts)
    return Contention(
        cores,
        nominal_cores,
        share,
        len(obs),
        f"fitted on {len(obs)} sync none point(s) at {', '.join(map(str, counts))} ranks per node",
        side,
        in_core,
        growth,
        growth >= GROWTH_MAX * 0.99,
    )
