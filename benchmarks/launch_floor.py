"""How much of a sweep's launch cost is amdahl's, and how much is Ray's own floor?

Starting a worker group is most of what a small sweep spends outside its measured steps
(benchmarks/sweep_timeline.py). Ray Tune scheduling a Ray Train V2 run starts a chain of new
processes (the Tune trainable, Train's controller, its worker group, ...), each importing Ray
and torch before it can start the next. This benchmark measures that chain with nothing of
amdahl in it, beside amdahl doing the same with one trial, in interleaved rounds on one local Ray
(127.0.0.1 only):

  ray-noop   the documented Tune-over-Train pattern at its smallest: a function trainable
             (0.01 CPU) fits a TorchTrainer of 2 workers holding CPUS_PER_WORKER each, whose
             loop reports once; the time is Tuner.fit() from call to return
  first      `run_sweep` of the D2L MLP on 2 devices with one warmup and one measured step,
             MLflow off, as the first sweep on this cluster shape (`recalibrate=True`:
             its closing calibration measured); the time is run_sweep from call to return
             (planning, the input rows, the launch, the trial, the calibration, results.parquet
             and the report), and, from its row, the part that is Ray Train starting the worker
             group (launch_entered_unix_s against the driver's clock, as sweep_timeline.py
             splits it)
  later      the same sweep as a later one in the same runs directory: the calibration reused
             from an earlier sweep on the same cluster shape (driver/calibration_reuse.py)

in rounds whose order rotates (round 0: ray-noop, first, later, so `later` always has a
measurement to reuse), and prints, per round and as medians: the times, each platform arm over
ray-noop, and the seconds beyond Ray's floor. Nothing is asserted.

    python benchmarks/launch_floor.py [--rounds N]

Run it on a quiet machine: every process start competes for the same cores.
"""

from __future__ import annotations

import argparse
import operator
import os
import statistics
import tempfile
import time
from pathlib import Path

from _harness import add_smoke_flag, paired, print_stamp, rotated

WORKERS = 2
CPUS_PER_WORKER = 0.5


def _noop_loop(config: dict) -> None:
    import ray.train

    ray.train.report({"done": 1})


def _noop_trainable(config: dict) -> None:
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        _noop_loop,
        scaling_config=ScalingConfig(
            num_workers=WORKERS, resources_per_worker={"CPU": CPUS_PER_WORKER}
        ),
        run_config=RunConfig(name=config["name"], storage_path=config["storage"]),
    )
    trainer.fit()
    tune.report({"done": 1})


def ray_noop_s(work: Path, index: int) -> float:
    """One Tune trial fitting one no-op Train run: seconds from Tuner.fit() to its return."""
    from ray import tune

    storage = str(work / "noop")
    start = time.perf_counter()
    tuner = tune.Tuner(
        tune.with_resources(_noop_trainable, {"CPU": 0.01}),
        param_space={"name": f"train-{index}", "storage": storage},
        run_config=tune.RunConfig(name=f"tune-{index}", storage_path=storage, verbose=0),
    )
    (result,) = tuner.fit()
    assert result.error is None, result.error
    return time.perf_counter() - start


def platform_s(work: Path, index: int, recalibrate: bool) -> tuple[float, float | None, float]:
    """A one-trial sweep: (run_sweep seconds, the part Ray Train took to start the group, the
    part its closing calibration took: a 2-device ddp trial communicates, so the sweep ends by
    measuring the all-reduce in its live group for `platform predict`, unless an earlier sweep
    in the runs directory measured it on this cluster shape and `recalibrate` is off)."""
    from amdahl import run_sweep, validate_spec
    from amdahl.driver.events import LaunchStarted, SweepEvent

    spec = validate_spec(
        {
            "name": f"floor{index}{'m' if recalibrate else 'r'}",
            "workload": "mlp",
            "train": {"steps": 1, "warmup_steps": 1},
            "grid": {"devices": [WORKERS], "batch_size": [64], "sync": ["ddp"]},
            "resources": {"cpus_per_device": CPUS_PER_WORKER, "cpus_per_data_worker": 0.5},
            "tracking": {"enabled": False},
        }
    )
    launched: list[float] = []

    def on_event(event: SweepEvent) -> None:
        if isinstance(event, LaunchStarted):
            launched.append(time.time())

    start = time.perf_counter()
    outcome = run_sweep(
        spec,
        runs_dir=work / "platform",
        tracking=False,
        on_event=on_event,
        recalibrate=recalibrate,
    )
    took = time.perf_counter() - start
    (row,) = outcome.rows
    assert row["status"] == "ok", row["error"]
    entered = row.get("launch_entered_unix_s")
    train_start = entered - launched[0] if entered and launched else None
    return took, train_start, outcome.calibration_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1

    import ray

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    work = Path(tempfile.mkdtemp(prefix="amdahl-floor-"))
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    arms = ["ray-noop", "first", "later"]
    took: dict[str, list[float]] = {arm: [] for arm in arms}
    group: list[float] = []
    calib: dict[str, list[float]] = {"first": [], "later": []}
    for r in range(args.rounds):
        for arm in rotated(arms, r):
            if arm == "ray-noop":
                took[arm].append(ray_noop_s(work, r))
                continue
            seconds, train_start, calibration_s = platform_s(work, r, arm == "first")
            took[arm].append(seconds)
            calib[arm].append(calibration_s)
            if train_start is not None:
                group.append(train_start)
        noop = took["ray-noop"][-1]
        print(
            f"round {r}: ray-noop {noop:.1f} s; first sweep {took['first'][-1]:.1f} s "
            f"(calibration {calib['first'][-1]:.1f} s) = {took['first'][-1] / noop:.2f}x; "
            f"later sweep {took['later'][-1]:.1f} s (calibration {calib['later'][-1]:.1f} s) "
            f"= {took['later'][-1] / noop:.2f}x",
            flush=True,
        )
    ray.shutdown()
    print_stamp()
    med = statistics.median
    print(
        f"\nmedian over {args.rounds} round(s): ray-noop {med(took['ray-noop']):.1f} s"
        + (f"; Ray Train starting a sweep's group {med(group):.1f} s" if group else "")
    )
    for arm in ("first", "later"):
        ratios = paired(took[arm], took["ray-noop"], operator.truediv)
        beyond = paired(took[arm], took["ray-noop"], operator.sub).median
        print(
            f"  {arm} sweep on this cluster shape: {med(took[arm]):.1f} s, closing calibration "
            f"{med(calib[arm]):.1f} s; / ray-noop {ratios.min_max('.2f')}; beyond Ray's floor "
            f"{beyond:.1f} s"
        )


if __name__ == "__main__":
    main()
