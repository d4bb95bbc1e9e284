"""How well the step-time model (amdahl.analysis.stepmodel) predicts trials it was not fitted on.

Runs a laptop grid in one process on one local Ray (MLflow off): the mlp workload on devices
1 and 2, per-device batch sizes 64, 128, 256 and 512, sync ddp, ddp_fp16, powersgd, zero1,
local_sgd and none (48 trials, one repeat, 1000 steps each: with 300 the same configuration
measured in two runs here differed by up to 27%, which no model can predict); then measures the
all-reduce alpha-beta as `platform calibrate` does (calibrate.run_calibration, 2 workers), which
also records the mlp's gradient bytes and parameter shapes into the sweep directory.

The model is fitted on a subset, every 1-device trial plus the multi-device trials at the
smallest and the largest batch, and predicts the held-out multi-device trials (the middle
batches). It prints each held-out trial's measured and predicted samples/s, then the median and
p90 absolute relative error against the goal (median <= 10%, p90 <= 20%), and, for reference,
the leave-one-out error over every multi-device trial. Nothing is asserted.

    python benchmarks/predictor_accuracy.py [--steps N] [--batches 64,128,256,512] [--keep]

Run it on a quiet machine: the two workers share the machine's cores with whatever else runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

SYNCS = ["ddp", "ddp_fp16", "powersgd", "zero1", "local_sgd", "none"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="measured steps per trial")
    parser.add_argument("--warmup", type=int, default=20, help="warmup steps per trial")
    parser.add_argument("--batches", default="64,128,256,512", help="per-device batch sizes")
    parser.add_argument("--keep", action="store_true", help="keep the sweep directory")
    args = parser.parse_args()
    batches = sorted(int(b) for b in args.batches.split(","))
    if len(batches) < 3:
        parser.error("--batches needs at least three sizes: two to fit on, one to predict")

    import ray

    from amdahl import run_sweep, validate_spec
    from amdahl.driver.calibrate import run_calibration

    work = Path(tempfile.mkdtemp(prefix="amdahl-predictor-"))
    spec = validate_spec(
        {
            "name": "predictor",
            "workload": "mlp",
            "train": {"steps": args.steps, "warmup_steps": args.warmup, "repeats": 1},
            "grid": {"devices": [1, 2], "batch_size": batches, "sync": SYNCS},
            "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
            "tracking": {"enabled": False},
        }
    )
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        start = time.perf_counter()
        outcome = run_sweep(spec, runs_dir=work, tracking=False, on_event=None)
        sweep_s = time.perf_counter() - start
        start = time.perf_counter()
        run_calibration(2, outcome.sweep_dir, resources_per_worker={"CPU": 0.5})
        calibrate_s = time.perf_counter() - start
    finally:
        ray.shutdown()

    ok = sum(1 for r in outcome.rows if r.get("status") == "ok")
    print(
        f"\n{len(outcome.rows)} trials ({ok} ok) in {sweep_s:.0f} s, calibration in "
        f"{calibrate_s:.0f} s; sweep directory {outcome.sweep_dir}"
    )
    evaluate(outcome.sweep_dir, batches)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def evaluate(sweep_dir: Path, batches: list[int]) -> None:
    """Fit on the 1-device trials and the smallest and largest batch, print the error on the
    held-out multi-device trials."""
    from amdahl.analysis.prediction import LooPoint, error_summary, leave_one_out
    from amdahl.analysis.stepmodel import fit
    from amdahl.report.predict import load_model_inputs

    inputs = load_model_inputs(sweep_dir)
    points = inputs.points()
    fit_batches = {batches[0], batches[-1]}
    train = [p for p in points if p.devices == 1 or p.batch in fit_batches]
    held = [p for p in points if p.devices > 1 and p.batch not in fit_batches]
    model = fit(inputs, train)
    comm = model.comm.intra
    if comm is not None:
        print(f"alpha = {comm.alpha_s * 1e6:.1f} us, B = {comm.bandwidth_Bps / 1e9:.3f} GB/s")
    print(f"fitted on {len(train)} trials (1 device, batches {sorted(fit_batches)})")
    for fam in model.families.values():
        if fam.has_compute:
            print(
                f"  {fam.label:28s} a_c {fam.a_c * 1e3:7.3f} ms  b_c {fam.b_c * 1e6:7.3f} us  "
                f"kappa {fam.kappa:5.2f}  gamma {fam.gamma:4.2f}  theta {fam.theta:5.2f}"
            )
    print(f"\n{'held-out trial':36s} {'measured':>10s} {'predicted':>10s} {'error':>8s}")
    predicted = []
    for p in held:
        pred = model.predict(model.families[p.family], p.devices, p.batch, p.nodes)
        if pred.throughput is None:
            print(f"{p.config.label:36s} {p.throughput:10,.0f} {'n/a':>10s}  {pred.unknown}")
            continue
        err = (pred.throughput - p.throughput) / p.throughput
        predicted.append(LooPoint(p.config, p.throughput, pred.throughput))
        print(f"{p.config.label:36s} {p.throughput:10,.0f} {pred.throughput:10,.0f} {err:+8.1%}")
    summary = error_summary(predicted)
    if summary:
        median, p90, n = summary
        print(
            f"\nheld-out absolute relative error over {n} trials: median {median:.1%} "
            f"(goal <= 10%), p90 {p90:.1%} (goal <= 20%)"
        )
    else:
        print("\nno held-out trial could be predicted")
    loo = error_summary(leave_one_out(inputs))
    if loo:
        print(
            f"leave-one-out over every multi-device trial ({loo[2]}): median {loo[0]:.1%}, "
            f"p90 {loo[1]:.1%}"
        )


if __name__ == "__main__":
    main()
