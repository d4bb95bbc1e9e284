"""The step-time model on device counts it never saw: fit a sweep at small device counts, predict
larger ones with `platform predict`'s own function, and measure those larger ones.

A fit sweep at the `--fit` device counts, then a truth sweep at the `--truth` counts (default
1, 2, 4 and 8, 12, 16), as a user fits then measures, on one local Ray sized to this machine
(MLflow off): the box's drift between the two (10-20% on the 2-core box for the same
configurations) is part of what the model must survive. `--truth-dir` reuses a truth sweep
measured before. `--interleaved` runs one sweep over both instead, its items repeat-major so
drift lands on fitted and held-out points alike; the model is then fitted on the `--fit` rows
only, with the closing calibration narrowed to the fitted device counts (its per-device-count
fits up to the widest fitted one: selfcheck.calibration_up_to), so the held-out counts'
all-reduce is extrapolated, as a user's would be whose cluster is no wider than the fitted
counts. `--calibrated-to N` keeps the calibration's fits up to N devices instead: a user whose
cluster holds the held-out counts but who ran trials only at the fitted ones (calibration takes
seconds, trials minutes). `--param NAME=VALUE` (repeatable) sets a workload parameter in both
sweeps: with `--workload simulated`, its jitter, straggler and in-core slowdown
(workloads/simulated.py). Each held-out
Each held-out
configuration's measured median (over `--repeats` runs, with its standard error:
Stat.rel_se_median) is compared with

- the model: the step-time model fitted on the fit sweep (`analysis.stepmodel.fit`, what
  `platform predict` uses), asked for each held-out configuration (a prediction the model
  withholds as a failed fit is made anyway, and marked);
- naive A: the Amdahl fit (analysis.scaling.fit_amdahl) over the fit sweep's speedups of that
  configuration, extrapolated;
- naive B: the largest fitted device count's per-device throughput times p.

It prints every held-out point, then the median and p90 |relative error| of each predictor at
each held-out device count, and the wall seconds of each sweep. Nothing is asserted.

Needs as many cores as the largest device count (gloo on CPU, one torch thread per rank): run
it on a 16-core machine for the default counts.

    python benchmarks/scale_check.py [--fit 1,2,4] [--truth 8,12,16] [--batches 64,256]
        [--syncs ddp,none] [--steps 150] [--repeats 2] [--workload mlp] [--out DIR]
        [--param NAME=VALUE ...] [--interleaved] [--truth-dir DIR] [--evaluate DIR [DIR]]
        [--calibrated-to N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _harness import add_smoke_flag, print_stamp


def _ints(text: str) -> list[int]:
    return sorted(int(x) for x in text.split(",") if x.strip())


def _param(text: str) -> tuple[str, object]:
    """NAME=VALUE, the value read as JSON where it parses (numbers, null), else a string."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", default="1,2,4", help="device counts the model is fitted on")
    parser.add_argument("--truth", default="8,12,16", help="device counts it must predict")
    parser.add_argument("--batches", default="64,256", help="per-device batch sizes")
    parser.add_argument("--syncs", default="ddp,none", help="sync strategies")
    parser.add_argument("--steps", type=int, default=150, help="measured steps per trial")
    parser.add_argument("--warmup", type=int, default=10, help="warmup steps per trial")
    parser.add_argument("--repeats", type=int, default=2, help="runs per configuration")
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--cpus-per-device", type=float, default=None, help="default: auto")
    parser.add_argument("--out", type=Path, default=None, help="where the two sweeps go")
    parser.add_argument(
        "--evaluate",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="only evaluate existing sweep directories: one interleaved sweep, or FIT TRUTH",
    )
    parser.add_argument(
        "--interleaved",
        action="store_true",
        help="one sweep over the fit and truth counts together instead of two",
    )
    parser.add_argument(
        "--param",
        type=_param,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a workload parameter, in both sweeps (repeatable)",
    )
    parser.add_argument(
        "--truth-dir",
        type=Path,
        default=None,
        help="a truth sweep directory measured before (same configurations): only the fit "
        "sweep runs",
    )
    parser.add_argument(
        "--host-cores",
        type=int,
        default=None,
        help="with --evaluate, for sweeps recorded before rows carried host_cores: the cores "
        "their node had (rows that have the column keep theirs)",
    )
    parser.add_argument(
        "--calibrated-to",
        type=int,
        default=None,
        help="with an interleaved sweep, the calibration's fits up to N devices feed the model "
        "(default: the widest fitted count)",
    )
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.fit, args.truth, args.batches, args.syncs = "1,2", "4", "64", "ddp"
        args.steps, args.warmup, args.repeats = 5, 2, 1
    print_stamp()
    fit_devices, truth_devices = _ints(args.fit), _ints(args.truth)
    if args.evaluate:
        if len(args.evaluate) > 2:
            parser.error("--evaluate takes one interleaved sweep directory, or FIT and TRUTH")
        evaluate(args.evaluate, fit_devices, truth_devices, args.host_cores, args.calibrated_to)
        return
    syncs = [s.strip() for s in args.syncs.split(",") if s.strip()]
    if "none" not in syncs:
        syncs.append("none")  # the model's compute term is fitted on sync none

    import ray

    from amdahl import UserError, run_sweep, validate_spec

    out = args.out or Path(tempfile.mkdtemp(prefix="amdahl-scale-"))
    resources = {}
    if args.cpus_per_device is not None:
        resources = {"cpus_per_device": args.cpus_per_device}

    def spec(name: str, devices: list[int]):
        return validate_spec(
            {
                "name": name,
                "workload": args.workload,
                "params": dict(args.param),
                "train": {
                    "steps": args.steps,
                    "warmup_steps": args.warmup,
                    "repeats": args.repeats,
                },
                "grid": {"devices": devices, "batch_size": _ints(args.batches), "sync": syncs},
                "resources": resources or "auto",
                "tracking": {"enabled": False},
            }
        )

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    dirs, walls = {}, {}
    sweeps = [("fit", fit_devices), ("truth", truth_devices)]
    if args.truth_dir is not None:  # measured before: only the fit sweep runs
        dirs["truth"], sweeps = args.truth_dir, sweeps[:1]
    elif args.interleaved:
        sweeps = [("scale", sorted({*fit_devices, *truth_devices}))]
    try:
        for name, devices in sweeps:
            start = time.perf_counter()
            try:
                outcome = run_sweep(spec(name, devices), runs_dir=out, tracking=False)
            except UserError as e:  # a sweep the plan refuses whole: its reason, not a traceback
                print(f"scale_check: the {name} sweep cannot run: {e}", file=sys.stderr)
                sys.exit(2)
            walls[name] = time.perf_counter() - start
            dirs[name] = outcome.sweep_dir
            ok = sum(1 for r in outcome.rows if r.get("status") == "ok")
            print(
                f"{name} sweep at devices {devices}: {len(outcome.rows)} rows ({ok} ok) in "
                f"{walls[name]:.0f} s -> {outcome.sweep_dir}",
                flush=True,
            )
            if refused := _refused_syncs(outcome.sweep_dir, syncs):
                said = "; ".join(f"{s}: {why}" for s, why in refused.items())
                print(f"scale_check: --syncs asked for what the plan refused ({said})")
                sys.exit(2)
    finally:
        ray.shutdown()
    paths = [dirs["scale"]] if "scale" in dirs else [dirs["fit"], dirs["truth"]]
    evaluate(paths, fit_devices, truth_devices)


def _refused_syncs(sweep_dir: Path, syncs: list[str]) -> dict[str, str]:
    """The asked-for sync strategies the plan refused for every trial (plan.json), with the
    reason: a held-out set without them would measure fewer strategies than its command says."""
    trials = json.loads((Path(sweep_dir) / "plan.json").read_text())["trials"]
    out = {}
    for sync in syncs:
        mine = [t for t in trials if t["settings"]["sync"] == sync]
        if mine and all(t.get("refused") for t in mine):
            out[sync] = mine[0]["refused"]
    return out


def _split(
    paths: list[Path],
    fit_devices: list[int],
    truth_devices: list[int],
    calibrated_to: int | None = None,
):
    """(fit inputs, truth inputs): of two sweeps as they are; of one, its rows split by device
    count and the calibration narrowed to the fitted counts, or to `calibrated_to` devices (said
    where it cannot be)."""
    import dataclasses

    from amdahl.analysis.selfcheck import calibration_up_to
    from amdahl.report.predict import load_model_inputs

    if len(paths) == 2:
        return load_model_inputs(paths[0]), load_model_inputs(paths[1])
    inputs = load_model_inputs(paths[0])
    narrowed = calibration_up_to(inputs.calibration, calibrated_to or max(fit_devices))
    if narrowed is None and inputs.calibration is not None:
        print(
            "note: the calibration has no fits at the fitted device counts: the fit sees the "
            f"all-reduce measured at {inputs.calibration.devices} devices"
        )

    def part(devices: list[int], calibration):
        configs = [c for c in inputs.configs if c.devices in devices]
        return dataclasses.replace(inputs, configs=configs, calibration=calibration)

    return part(fit_devices, narrowed or inputs.calibration), part(truth_devices, None)


def evaluate(
    paths: list[Path],
    fit_devices: list[int],
    truth_devices: list[int],
    host_cores: int | None = None,
    calibrated_to: int | None = None,
) -> None:
    """Print each held-out point against the model and the two naive predictors."""
    from amdahl.analysis.heldout import curve_key, scored_points
    from amdahl.analysis.stepmodel import fit as fit_model

    fit_inputs, truth_inputs = _split(paths, fit_devices, truth_devices, calibrated_to)
    if host_cores is not None:
        for r in (r for c in fit_inputs.configs for r in c.rows):
            if r.get("host_cores") is None:
                r["host_cores"] = host_cores
    model = fit_model(fit_inputs)
    _print_fit(model)
    comm = model.comm.intra
    if comm is not None:
        print(
            f"calibration: alpha {comm.alpha_s * 1e6:.1f} us, B {comm.bandwidth_Bps / 1e9:.3f} GB/s"
        )
    errors: dict[str, dict[int, list[float]]] = {"model": {}, "amdahl": {}, "linear": {}, "se": {}}
    print(
        f"\n{'held-out':24s} {'measured':>10s} {'se':>7s} {'model':>10s} {'err':>7s} "
        f"{'amdahl':>10s} {'err':>7s} {'linear':>10s} {'err':>7s}"
    )
    scored = scored_points(model, fit_inputs, truth_inputs, truth_devices)
    for point in sorted(scored, key=lambda s: (curve_key(s.config), s.config.devices)):
        _print_point(point, errors)
    _print_summary(errors, truth_devices)
    _print_intervals(fit_inputs, truth_inputs, truth_devices)


def _print_intervals(fit_inputs, truth_inputs, truth_devices: list[int]) -> None:
    """The 80% interval `platform predict` gives each held-out point (analysis/intervals.py,
    made for a withheld failed fit too) against its measured throughput, per device count:
    how many it held and its median half-width (issue 49's goal: 75-90% held, <= 20%)."""
    from amdahl.analysis.heldout import held_out_bands

    held: dict[int, list[bool]] = {}
    halves: dict[int, list[float]] = {}
    for c, band in held_out_bands(fit_inputs, truth_inputs, truth_devices):
        held.setdefault(c.devices, []).append(band.contains(c.throughput.median))
        halves.setdefault(c.devices, []).append(band.half_width)
    print("80% intervals (platform predict's) against the measured throughput:")
    for p in sorted(held):
        print(
            f"  p={p:<3d} held {sum(held[p])} of {len(held[p])}, median half-width "
            f"{statistics.median(halves[p]):.1%}"
        )
    every = [h for p in held for h in held[p]]
    if every:
        widths = [w for p in halves for w in halves[p]]
        print(
            f"  all: held {sum(every)} of {len(every)} ({sum(every) / len(every):.0%}), median "
            f"half-width {statistics.median(widths):.1%}"
        )


def _print_fit(model) -> None:
    """What the model fitted: contention, each strategy's gamma and theta, the collective's
    growth."""
    for fam in model.families.values():
        if fam.sync == "none" and fam.contention is not None:
            print(f"{fam.label}: {fam.contention.describe()}")
        elif fam.sync != "none":
            print(f"{fam.label}: gamma {fam.gamma:.2f}, theta {fam.theta:.2f} ({fam.gamma_source})")
    print(f"communication: {model.comm.growth()}")


def _print_point(point, errors) -> None:
    """One held-out point against each predictor (analysis/heldout.py's scorer), its errors
    kept by device count for the summary."""
    from amdahl.analysis.heldout import curve_key

    c, pred = point.config, point.prediction
    cells = []
    for name, value in point.predicted().items():
        if value is None:
            cells.append(f"{'n/a':>10s} {'':>7s}")
            continue
        err = value / point.measured - 1
        errors[name].setdefault(c.devices, []).append(abs(err))
        cells.append(f"{value:10,.0f} {err:+7.1%}")
    se = c.throughput.rel_se_median
    if se is not None:
        errors.setdefault("se", {}).setdefault(c.devices, []).append(se)
    mark = " FAILED FIT" if pred and pred.failed_fit else ""
    if pred and any("queueing for cores" in c for c in pred.caveats):
        mark += " (cores' load extrapolated: caveat)"
    if pred and pred.unknown:
        mark += f" ({pred.unknown})"
    spread = f"{se:7.1%}" if se is not None else f"{'n=1':>7s}"
    sync, batch = curve_key(c)
    label = f"{sync} b{batch} p{c.devices}"
    print(f"{label:24s} {point.measured:10,.0f} {spread} {' '.join(cells)}{mark}")


def _print_summary(errors, truth_devices: list[int]) -> None:
    from amdahl.analysis.selfcheck import quantile

    print(
        "\n|relative error| by held-out device count (median / p90); se: the measured medians' "
        "standard error (an error within it is as close as the measurement allows):"
    )
    for p in truth_devices:
        parts = []
        for name, by_p in errors.items():
            xs = sorted(by_p.get(p, []))
            if xs:
                parts.append(f"{name} {statistics.median(xs):.1%} / {quantile(xs, 0.9):.1%}")
        print(f"  p={p:<3d} " + "   ".join(parts))
    for name, by_p in errors.items():
        xs = sorted(x for v in by_p.values() for x in v)
        if xs:
            print(
                f"  all held-out, {name}: median {statistics.median(xs):.1%}, "
                f"p90 {quantile(xs, 0.9):.1%} over {len(xs)} points"
            )


if __name__ == "__main__":
    main()
