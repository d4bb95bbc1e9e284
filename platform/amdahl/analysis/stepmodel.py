"""The step-time model: per configuration family, the terms below fitted from the measured
points (analysis/points.py), and the prediction of one family at a device count, per-device
batch and node count. It predicts configurations the sweep did not measure (other device counts,
batch sizes, node counts) from results.parquet plus calibration.json; analysis/prediction.py
puts it to use; analysis/families.py holds a family and its compute term.

Per configuration family (every setting except the device count and the per-device batch):

    compute        T_c(b, p) = a_p + b_p * b              (per measured device count p, fitted
                                                           on sync none: analysis/computefit.py;
                                                           an unmeasured p: the nearest line x
                                                           host contention, contention.py)
                   + omega                                (the strategy's wrapper, per step)
    communication  T_n(p) = latency_steps * alpha(p) + bytes(sync, p, options) / B(p)
                   x theta                                (fitted per strategy, 1 if unknown;
                                                           options: the family's own)
    step           (T_c^gamma + T_n^gamma)^(1/gamma)      (Pollux's overlap exponent, 1..8:
                                                           analysis/overlapfit.py)
    wall per step  step + data wait                       (the family's measured data wait)
    throughput     global batch / wall per step

Compute is fitted from what compute is: the `sync: none` sibling's trials give a line at 1
device (a_c, b_c) and one at each device count measured (contention measured, not assumed; kappa
reported as the ratio at the largest); an unmeasured count takes the nearest line times the
slowdown of the host-contention model (analysis/contention.py) between the two, and says so.
omega is the wrapper's cost (DDP's reducer on one device): the strategy's 1-device trials minus
the sync-none line. Without a sync-none sibling, the family's own trials (wrapper inseparable;
multi-device ones through `comm_s`, scaled by a fitted kappa). A family with activation
checkpointing computes, where its trials did not measure it, what its twin without measured x
the recompute factor (measured on one device, else the hardware FLOPs' ratio:
families.take_recompute). gamma and theta are fitted per sync strategy over its multi-device
trials (squared log error of the step, plus a small penalty on log theta), else pooled, else 1
and 1: gamma is 1, known, for a family whose gradient is one DDP bucket at its own
bucket_cap_mb (no overlap: comm.no_overlap), so a strategy's one-bucket and several-bucket
families are fitted apart, and theta is fixed near 1 where the points cannot separate the two.
theta is what the strategy's communication costs against the calibrated ring (ZeRO's partition
broadcast, PowerSGD's factorisation, hook casts, comm threads taking cores).

A fitted parameter on a bound of its range (theta at 1/4 or 16, a fitted kappa at 1/4 or 4, a
compute line's intercept or slope forced to 0) is a failed fit (`computefit.BoundHit`): the
family lists it and `predict` withholds the predictions that use it (`withhold=False`, for
checks, gives them flagged). gamma's ends are not failures: 1 is no overlap and 8 is, within
9%, full overlap, both states a system can be in.

alpha and B come from calibration.json (`alpha_s`, `bandwidth_Bps`, measured within a node by
`platform calibrate`, and `by_devices`: the same at smaller device counts, from which
analysis/comm.py fits how they grow with p; gloo's counts above the node's cores fit a law of
their own, whose link holds the queueing, not stretched again). With `inter_node_alpha_s` and
`inter_node_bandwidth_Bps` (put there by hand: `platform calibrate` does not measure across
nodes), a prediction that spans nodes uses those for every collective (a ring across nodes runs
at its slowest link); without them, the intra-node terms, said. Bytes per optimizer step:
comm.comm_volume, from calibration.json's `grad_bytes_for(params)` (no row holds gradient
bytes; PowerSGD needs `param_shapes_by_params`, else labels an estimate), at the family's own
options (a sweep's `grid.options` lists make families of different bucket_cap_mb,
accumulate_steps, ...: families.family_options). Data wait is not modelled: the family's
measured per-step wait at the same per-device batch (else its median).

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from amdahl import strategies
from amdahl.analysis.calibration import Calibration
from amdahl.analysis.comm import (
    CommModel,
    CommVolume,
    Link,
    comm_model,
    comm_volume,
    communicates,
    no_overlap,
)
from amdahl.analysis.computefit import on_bound
from amdahl.analysis.configs import NO_SYNC, Config, option_values
from amdahl.analysis.families import (
    SILENT,
    Family,
    adopt_compute,
    family_options,
    fit_compute,
    fit_data_wait,
    recorded_options,
    take_recompute,
    twin_key,
)
from amdahl.analysis.overlapfit import THETA_RANGE, combine, fit_overlap, theta_hit
from amdahl.analysis.points import (
    FAMILY_SETTINGS,
    Point,
    family_key,
    family_micro_steps,
    measured_point,
)
from amdahl.spec.schema import OptionsSpec, options_column


@dataclass(frozen=True)
class Prediction:
    devices: int
    batch: float  # per device
    nodes: int
    compute_s: float | None = None
    comm_s: float | None = None
    data_wait_s: float | None = None
    step_s: float | None = None
    throughput: float | None = None
    volume: CommVolume | None = None
    link: Link | None = None
    unknown: str = ""  # why there is no prediction
    caveats: tuple[str, ...] = ()
    failed_fit: tuple[str, ...] = ()  # the failed fits it uses (withheld unless asked for)


@dataclass
class StepModel:
    families: dict[tuple, Family]
    comm: CommModel
    options: OptionsSpec
    #: (sync, why it cannot overlap or "") -> (gamma, theta, points): stepmodel._overlap_group
    overlaps: dict[tuple[str, str], tuple[float, float, int]] = field(default_factory=dict)
    pooled_overlap: tuple[float, float, int] | None = None
    #: The widest device count whose measured steps gamma and theta were fitted on.
    widest_fitted: int = 0

    def host_comm(self, family: Family, batch: float, devices: int, nodes: int) -> float:
        """The contention factor of the communication term: gloo's collectives are host work
        (each ring step needs a core), so they stretch as the ranks' compute fills the cores;
        NCCL's run on the devices (1)."""
        if self.comm.backend != "gloo" or self.comm.queueing_measured(devices, nodes):
            return 1.0
        return family.comm_inflation(batch, devices, nodes)

    def family_of(self, c: Config) -> Family | None:
        return self.families.get(family_key(c.settings))

    def predict(
        self, family: Family, devices: int, batch: float, nodes: int = 1, *, withhold: bool = True
    ) -> Prediction:
        """The family at `devices` x per-device `batch` on `nodes`. A prediction that uses a
        failed fit (a parameter on a bound) is withheld, or with `withhold=False` made and
        flagged (for checks of the model, never for users' figures)."""
        p, nodes = max(1, int(devices)), max(1, int(nodes))
        compute = family.compute_s(batch, p, nodes)
        if compute is None:
            why = "no compute measurement in this family or its sync none sibling"
            return Prediction(p, batch, nodes, unknown=why)
        failed = tuple(h.short() for h in family.failed(p))
        if failed and withhold:
            why = "withheld, failed fit (what it means: above): " + "; ".join(failed)
            return Prediction(p, batch, nodes, unknown=why, failed_fit=failed)
        caveats = [f"FAILED FIT: {f}" for f in failed]
        if note := family.compute_caveat(p, batch, nodes):
            caveats.append(note)
        if family.sync not in strategies.NAMES:
            return Prediction(p, batch, nodes, compute, unknown=f"unknown sync {family.sync!r}")
        comm = self._comm_part(family, p, batch, nodes)
        if isinstance(comm, str):
            return Prediction(p, batch, nodes, compute, unknown=comm)
        caveats.extend(comm.caveats)
        step = combine(compute, comm.comm_s, family.gamma)
        wait, how = family.data_wait_s(batch)
        if how != "measured at this batch":
            caveats.append(f"data wait {how}")
        return replace(
            comm,
            compute_s=compute,
            data_wait_s=wait,
            step_s=step,
            throughput=batch * p * family.micro / (step + wait),
            caveats=tuple(caveats),
            failed_fit=failed,
        )

    def _comm_part(self, family: Family, p: int, batch: float, nodes: int) -> Prediction | str:
        """`family`'s prediction at `p` devices as far as its communication goes (`comm_s`,
        `volume`, `link` and their caveats), or why the model has none (no link calibrated, no
        gradient bytes)."""
        if not communicates(family.sync, p):
            return Prediction(p, batch, nodes, comm_s=0.0)
        link, caveat = self.comm.link(nodes, p)
        if link is None:
            return (
                "no communication model: no calibration.json with alpha and "
                "bandwidth (run `platform calibrate DIR --devices N`)"
            )
        if not family.grad_bytes:
            return (
                "gradient bytes unknown (not in calibration.json: run "
                "`platform calibrate` with the sweep's spec.yaml in DIR)"
            )
        caveats = [caveat] if caveat else []
        if (span := self.comm.calibrated_range) and p > max(span[1], self.widest_fitted):
            caveats.append(
                f"communication at {p} devices: {self.comm.growth()}; where the cluster "
                f"holds {p}, `platform calibrate DIR --devices {p}` measures it in seconds"
            )
        volume = comm_volume(family.sync, p, family.grad_bytes, family.options, family.shapes)
        if volume.estimate:
            caveats.append(volume.estimate)
        seconds = volume.seconds(link) * family.theta * self.host_comm(family, batch, p, nodes)
        return Prediction(
            p, batch, nodes, comm_s=seconds, volume=volume, link=link, caveats=tuple(caveats)
        )


@dataclass
class ModelInputs:
    """What the model is fitted from: the sweep's configurations, calibration and options."""

    configs: list[Config]
    calibration: Calibration | None = None
    options: OptionsSpec = field(default_factory=OptionsSpec)
    price: float = 0.0
    name: str = "sweep"
    notes: list[str] = field(default_factory=list)
    #: The memory probe's facts by (workload parameters as JSON, precision), from plan.json:
    #: `platform predict`'s memory per device (analysis/memory_model.py).
    memory_facts: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: Bytes per device the rows hold beyond the memory model (memory_model.Overhead).
    memory_overhead_bytes: float = 0.0

    def points(self) -> list[Point]:
        return [pt for c in self.configs if (pt := measured_point(c)) is not None]


def fit(inputs: ModelInputs, points: list[Point] | None = None) -> StepModel:
    """Fit every family's compute line, kappa and gamma from `points` (default: all measured)."""
    points = inputs.points() if points is None else points
    cores = [pt.host_cores for pt in points if pt.host_cores]
    comm = comm_model(inputs.calibration, statistics.median(cores) if cores else None)
    model = StepModel({}, comm, inputs.options)
    by_family: dict[tuple, list[Point]] = {}
    recorded = recorded_options(inputs.configs)
    for c in inputs.configs:  # every family, measured or not, in the report's order
        key = family_key(c.settings)
        if key not in model.families:
            model.families[key] = _new_family(key, c, inputs, recorded)
            by_family[key] = []
    for pt in points:
        by_family.setdefault(pt.family, []).append(pt)
    for key, fam in model.families.items():
        fit_compute(fam, by_family[key])
        fit_data_wait(fam, by_family[key])
    _take_recomputes(model, by_family, silent=True)
    for key, fam in model.families.items():
        sibling = model.families.get(_sibling_key(fam))
        if sibling is not None and sibling is not fam and sibling.has_compute:
            adopt_compute(fam, sibling, by_family[key])
    _take_recomputes(model, by_family, silent=False)
    _fit_overlaps(model, points)
    return model


def _take_recomputes(
    model: StepModel, by_family: dict[tuple, list[Point]], *, silent: bool
) -> None:
    """Each checkpointed family takes what its trials did not measure from its twin without
    checkpointing (families.take_recompute): the sync-none ones first, as the strategies then
    borrow their compute (the twin of each is final by then)."""
    for key, fam in model.families.items():
        if (fam.sync in SILENT) != silent:
            continue
        twin = model.families.get(twin_key(fam))
        if twin is not None and twin.has_compute:
            take_recompute(fam, twin, by_family[key], by_family[twin.key])


def _sibling_key(fam: Family) -> tuple:
    """The family of `fam`'s `sync: none` trials: the same settings but sync, and of its
    options only those sync none reads too (the compile's), as its trials' `options` column
    records only the options a trial reads."""
    settings = {**fam.settings, "sync": NO_SYNC}
    read = strategies.options_read(str(settings.get("compile")), NO_SYNC)
    kept = {k: v for k, v in option_values(settings).items() if k in read}
    return family_key({**settings, "options": options_column(kept)})


def _new_family(key: tuple, c: Config, inputs: ModelInputs, recorded: set[str]) -> Family:
    settings = dict(zip(FAMILY_SETTINGS, key, strict=True))
    label = " ".join(c.label.split(" ")[2:])
    fam = Family(key=key, label=label, settings=settings)
    if inputs.calibration is not None:
        fam.grad_bytes = inputs.calibration.grad_bytes_for(settings.get("params"))
        fam.shapes = inputs.calibration.shapes_for(settings.get("params"))
    fam.options = family_options(c.settings, inputs.options, recorded)
    fam.micro = float(family_micro_steps(settings, fam.options.model_dump()))
    return fam


def _fit_overlaps(model: StepModel, points: list[Point]) -> None:
    """gamma and theta per overlap group (`_overlap_group`) over its multi-device points with a
    communication term; a family whose group has none takes its strategy's other group's (gamma
    1 where its own gradient is one bucket), else the pool of every group's points."""
    pairs = _overlap_observations(model, points)
    notes: dict[tuple[str, str], str] = {}
    for group, obs in pairs.items():
        gamma, theta, notes[group] = fit_overlap(tuple(obs), group[1])
        model.overlaps[group] = (gamma, theta, len(obs))
    everything = tuple(o for obs in pairs.values() for o in obs)
    unfitted = [
        f for f in model.families.values() if f.sync not in SILENT and not _fitted_group(model, f)
    ]
    pooled_note = ""
    if everything and unfitted:
        gamma, theta, pooled_note = fit_overlap(everything)
        model.pooled_overlap = (gamma, theta, len(everything))
    for fam in model.families.values():
        if fam.sync in SILENT:
            fam.gamma_source = "not used: no communication"
            continue
        group = _overlap_group(fam)
        one_bucket = group[1]
        fitted = _fitted_group(model, fam)
        if fitted == group:
            fam.gamma, fam.theta, n = model.overlaps[group]
            source, note = f"fitted over {n} multi-device {fam.sync} point(s)", notes[group]
        elif fitted:
            gamma, fam.theta, n = model.overlaps[fitted]
            fam.gamma = 1.0 if one_bucket else gamma
            kind = "several-bucket" if one_bucket else "one-bucket"
            source = f"fitted over {n} multi-device {kind} {fam.sync} point(s)"
            note = one_bucket or notes[fitted]
        elif model.pooled_overlap:
            gamma, fam.theta, n = model.pooled_overlap
            fam.gamma = 1.0 if one_bucket else gamma
            source = f"pooled over {n} multi-device point(s) of other strategies"
            note = one_bucket or pooled_note
        else:
            continue
        fam.gamma_source = f"gamma and theta {source}" + (f" ({note})" if note else "")
        if side := on_bound(fam.theta, *THETA_RANGE):
            fam.hits.append(theta_hit(fam.theta, side))


def _overlap_group(fam: Family) -> tuple[str, str]:
    """(sync, why it cannot overlap or ""): a strategy's families whose gradient is one DDP
    bucket at their own `bucket_cap_mb` communicate after the backward (gamma 1, known), while
    its families of several buckets overlap theirs, so the two are fitted apart."""
    return fam.sync, no_overlap(fam.sync, [fam.grad_bytes], fam.options)


def _fitted_group(model: StepModel, fam: Family) -> tuple[str, str] | None:
    """The fitted overlap group `fam` takes gamma and theta from: its own, else its strategy's
    other one; None when its strategy has no fitted group."""
    own = _overlap_group(fam)
    if own in model.overlaps:
        return own
    return next((g for g in model.overlaps if g[0] == fam.sync), None)


def _overlap_observations(
    model: StepModel, points: list[Point]
) -> dict[tuple[str, str], list[tuple[float, float, float]]]:
    """Per overlap group, (compute, calibrated comm, busy step) of each communicating point."""
    pairs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for pt in points:
        fam = model.families.get(pt.family)
        if fam is None or pt.devices <= 1 or fam.sync in SILENT or not fam.sync:
            continue
        compute = fam.compute_s(pt.batch, pt.devices, pt.nodes)
        link, _ = model.comm.link(pt.nodes, pt.devices)
        if compute is None or link is None or not fam.grad_bytes:
            continue
        volume = comm_volume(fam.sync, pt.devices, fam.grad_bytes, fam.options, fam.shapes)
        comm = volume.seconds(link) if volume else 0.0
        comm *= model.host_comm(fam, pt.batch, pt.devices, pt.nodes)
        if comm > 0:
            pairs.setdefault(_overlap_group(fam), []).append((compute, comm, pt.busy_s))
            model.widest_fitted = max(model.widest_fitted, pt.devices)
    return pairs
