"""Ray Data against a tuned torch DataLoader on the same preprocessing, as a trial reads each.

Both arms are the trial's own input path, put together from the functions the driver and the
worker call (nothing re-implemented here). The rows are the ResNet workload's
Fashion-MNIST-format rows (raw uint8 bytes in parquet), decoded, augmented and normalised by
`ResNet.preprocess`. Each round is one launch per arm (a one-rank `LaunchConfig` of the
benchmark's settings) read by two trials in a row, as the trials of a launch read it:
  ray_data      `data.prepare.with_preprocessing` over the stored rows, one pass sized by
                `protocol.sizing.rows_per_launch` (as `driver.trainable.launch_trainable` builds
                it), split by Ray Train's own `DataConfig` (the streaming split a one-worker
                group's `get_dataset_shard` returns) and read through `worker.input.
                launch_stream`: started once per launch (`warm`, timed apart, as the harness
                does before the first trial), then sliced by every trial, never restarted
                between trials or epochs
  torch_loader  `worker.input.LoaderSource` over the rows put in the object store by
                `data.storage.put_rows` (as `materialise_datasets` puts them), one per launch;
                each trial's `host_batches` starts its own DataLoader with `num_workers` persistent
                workers (as each trial of a launch does)
The DataLoader is tuned first: every num_workers from 1 to the CPU count is measured and the
fastest is kept; Ray Data then gets the same number of workers. The two trials of a launch:
  ingest  a consumer that does nothing: rows/s over two training sets' worth of batches, after
          warmup batches
  train   the consumer trains ResNet-18 (one torch thread, like a platform worker): samples/s
          and data wait as a share of step time
Start-up is printed apart: the ray_data launch's `warm` (once per launch) and each arm's first
batch of a trial (the DataLoader starts its workers there, every trial). As in a launch, the
ray_data pipeline runs on from `warm`, so its first trial finds what the executor buffered
meanwhile (bounded by Ray Data's backpressure); a DataLoader holds `prefetch` batches at most.
Rounds alternate which arm goes first; medians are printed with the ratios. Goals
(docs/architecture.md): Ray Data ingest >= 0.9x the DataLoader; data wait <= 5% of step time
when the data workers suffice.

    python benchmarks/input_pipeline.py [--rounds N] [--augment none|light|heavy] [--data DIR]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from _harness import add_smoke_flag, print_stamp, rotated, spread

from amdahl.columns import TrialSettings
from amdahl.data.prepare import ray_dataset, with_preprocessing
from amdahl.data.storage import dataset_path, put_rows
from amdahl.protocol.contract import LaunchConfig, TrialConfig, WorkerResources
from amdahl.protocol.sizing import rows_per_launch
from amdahl.spec.schema import TrainSpec
from amdahl.worker.input import LoaderSource, host_batches, launch_stream
from workloads.resnet import ResNet

NAMES = ("ray_data", "torch_loader")


def bench_launch(args, params: dict, path: str, name: str, workers: int) -> LaunchConfig:
    """A one-rank launch of this benchmark's trial settings whose two repeats are the two
    consumers (ingest, train): `rows_per_launch` then sizes the ray_data pass as a sweep's
    trainable sizes it, for the longer of the two."""
    settings = TrialSettings(
        devices=1,
        batch_size=args.batch,
        precision="fp32",
        compile="eager",
        sync="none",
        data_workers=workers,
        input=name,
        prefetch_batches=args.prefetch,
        axis_params={},
        params=params,
        options={},
    )
    trial = TrialConfig(trial_id=f"bench-{name}", settings=settings, per_device_batch=args.batch)
    return LaunchConfig(
        launch_id=f"bench-{name}",
        sweep="input_pipeline",
        workload="resnet",
        trials=(trial,),
        train=TrainSpec(
            steps=max(_ingest_batches(args), args.train_steps),
            warmup_steps=args.warmup,
            repeats=2,
        ),
        resources=WorkerResources(1, 1.0, 0.0, args.cpus_per_worker),
        device_counts=(1,),
        collective_timeout_s=600,
        train_path=path,
        val_path=None,
        dataset_key="input_pipeline",
        preprocesses=True,
        placement="PACK",
        storage_path="",
        run_name="",
    )


class Arm:
    """One arm's input for one launch, built as the driver and the harness build it."""

    def __init__(self, name: str, launch: LaunchConfig, base: Any, rows_ref: Any, workload: Any):
        self.name, self.launch, self.workload = name, launch, workload
        self.warm_s: float | None = None
        self._coordinator: Any = None
        if name == "torch_loader":
            self.source: Any = LoaderSource(
                rows_ref, workload, rank=0, world=1, workers=launch.data_workers
            )
            return
        from ray.train import DataConfig

        trial = launch.trials[0]
        ds = with_preprocessing(
            base,
            workload,
            launch.data_workers,
            launch.resources.cpus_per_data_worker,
            trial.per_device_batch,
            rows_per_launch(launch) * launch.resources.workers,
        )
        split = DataConfig().configure(
            {"train": ds}, world_size=1, worker_handles=None, worker_node_ids=None
        )[0]["train"]
        self._coordinator = getattr(split, "_coord_actor", None)
        self.source = launch_stream(split, launch, pin=False)
        self.warm_s = self.source.warm()

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """One trial's stream of host batches (CPU: no pinning)."""
        trial = self.launch.trials[0]
        prefetch = trial.settings.prefetch_batches
        return host_batches(self.source, trial.per_device_batch, prefetch, False)

    def close(self) -> None:
        """Stop the launch's input before the next arm runs: the split's executor is shut down
        as Ray Train shuts it down when a run ends (`shutdown_data_executors`); the
        DataLoader's workers end with the trial's iterator."""
        import ray

        if self._coordinator is not None:
            ray.get(self._coordinator.shutdown_executor.remote(), timeout=30)
            self._coordinator = None
        self.source = None
        gc.collect()


def _ingest_batches(args) -> int:
    return 2 * (args.rows // args.batch)


def ingest(batches: Iterator, args) -> tuple[float, float]:
    """(rows/s into a consumer that does nothing, seconds to the trial's first batch)."""
    start = time.perf_counter()
    next(batches)
    first_s = time.perf_counter() - start
    for _ in range(args.warmup - 1):
        next(batches)
    count = _ingest_batches(args)
    start = time.perf_counter()
    for _ in range(count):
        next(batches)
    return count * args.batch / (time.perf_counter() - start), first_s


def train(batches: Iterator, workload: ResNet, args) -> tuple[float, float, float]:
    """(data wait / step time, samples/s, seconds to the first batch) training ResNet-18."""
    torch.manual_seed(0)
    model = workload.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    waits, steps, first_s = [], [], 0.0
    for step in range(args.warmup + args.train_steps):
        t0 = time.perf_counter()
        x, y = workload.split_batch(next(batches))
        t1 = time.perf_counter()
        loss = workload.loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if step == 0:
            first_s = t1 - t0
        if step >= args.warmup:
            waits.append(t1 - t0)
            steps.append(t2 - t0)
    return sum(waits) / sum(steps), args.batch * len(steps) / sum(steps), first_s


@dataclass(frozen=True)
class Inputs:
    """What every launch of either arm reads: the workload, its stored training set (`path`),
    Ray Data's dataset of it (`base`) and the DataLoader's rows in the object store."""

    workload: ResNet
    path: str
    base: Any
    rows_ref: Any


def one_launch(name: str, args, inputs: Inputs, workers: int) -> dict:
    """One launch of arm `name`: its input built, then the ingest and train trials in a row."""
    workload = inputs.workload
    launch = bench_launch(args, workload.params, inputs.path, name, workers)
    arm = Arm(name, launch, inputs.base, inputs.rows_ref, workload)
    try:
        batches = arm.batches()
        rows_per_s, ingest_first = ingest(batches, args)
        batches.close()
        batches = arm.batches()
        wait, samples_per_s, train_first = train(batches, workload, args)
        batches.close()
    finally:
        arm.close()
    return {
        "rows_per_s": rows_per_s,
        "wait": wait,
        "samples_per_s": samples_per_s,
        "warm_s": arm.warm_s,
        "first_s": [ingest_first, train_first],
    }


def tune_workers(args, inputs: Inputs, cpus: int) -> int:
    """The DataLoader's best num_workers by ingest rows/s (1 to the CPU count)."""
    tuning = {}
    for w in range(1, cpus + 1):
        launch = bench_launch(args, inputs.workload.params, inputs.path, "torch_loader", w)
        arm = Arm("torch_loader", launch, None, inputs.rows_ref, inputs.workload)
        batches = arm.batches()
        tuning[w] = ingest(batches, args)[0]
        batches.close()
        arm.close()
    best = max(tuning, key=tuning.get)
    print(
        "tuned DataLoader: "
        + ", ".join(f"num_workers={w}: {v:,.0f} rows/s" for w, v in tuning.items())
        + f" -> {best}"
    )
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8192, help="training rows (synthetic)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--augment", default="heavy", choices=["none", "light", "heavy"])
    parser.add_argument("--augment-ops", type=int, default=2)
    parser.add_argument("--width", type=int, default=8, help="ResNet-18 first-stage channels")
    parser.add_argument("--train-steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=4, help="batches before timing (>= 1)")
    parser.add_argument("--cpus-per-worker", type=float, default=0.5)
    parser.add_argument("--data", default=None, help="params.data: your own train/ val/ parquet")
    parser.add_argument("--workers", type=int, default=None, help="skip tuning: use this many")
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.rows, args.train_steps, args.warmup = 1, 512, 3, 1
        args.workers = args.workers or 1
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first batch is start-up, timed apart)")

    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("AMDAHL_DATA_DIR", os.path.join(tempfile.gettempdir(), "amdahl-bench"))
    import ray

    cpus = os.cpu_count() or 1
    ray.init(
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    torch.set_num_threads(1)  # the consumer is one platform worker; the rest feed it
    params = {
        "width": args.width,
        "augment": args.augment,
        "augment_ops": args.augment_ops,
        "train_rows": args.rows,
    }
    if args.data:
        params["data"] = args.data
    workload = ResNet(**params)
    path = str(dataset_path(workload, "resnet", "train", seed=0))
    base = ray_dataset(path, args.cpus_per_worker)
    rows_ref = put_rows(path)
    if args.data:
        args.rows = base.count()

    print(
        f"{args.rows} rows, batch {args.batch}, prefetch {args.prefetch}, augment {args.augment}"
        f" (ops {args.augment_ops}), ResNet-18 width {args.width}, {cpus} CPUs"
    )
    inputs = Inputs(workload, path, base, rows_ref)
    workers = args.workers or tune_workers(args, inputs, cpus)

    runs: dict[str, list[dict]] = {n: [] for n in NAMES}
    for r in range(args.rounds):
        order = rotated(NAMES, r)
        for name in order:
            runs[name].append(one_launch(name, args, inputs, workers))
        print(
            f"round {r + 1} ({order[0]} first): "
            + "  ".join(
                f"{n} {runs[n][-1]['rows_per_s']:,.0f} rows/s, "
                f"{runs[n][-1]['samples_per_s']:,.0f} samples/s, "
                f"data wait {runs[n][-1]['wait']:.1%}"
                for n in NAMES
            ),
            flush=True,
        )
    ray.shutdown()
    print_stamp()
    _print_summary(runs, args.rounds, workers)


def _print_summary(runs: dict[str, list[dict]], rounds: int, workers: int) -> None:
    med = lambda name, key: statistics.median(x[key] for x in runs[name])  # noqa: E731
    print(f"\nmedians over {rounds} rounds (arm order alternating), {workers} data workers each:")
    for n in NAMES:
        first = statistics.median(s for x in runs[n] for s in x["first_s"])
        print(
            f"  {n:13s} ingest {med(n, 'rows_per_s'):>8,.0f} rows/s   training "
            f"{med(n, 'samples_per_s'):>6,.0f} samples/s, data wait {med(n, 'wait'):6.1%} of "
            f"step time; a trial's first batch {first:.2f} s"
        )
    print(f"  ray_data's launch start (`warm`, once per launch): {med('ray_data', 'warm_s'):.2f} s")
    ratios = [a["rows_per_s"] / b["rows_per_s"] for a, b in zip(*runs.values(), strict=True)]
    trained = [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(*runs.values(), strict=True)]
    for label, values, goal in (
        ("ingest", ratios, "  (goal >= 0.9)"),
        ("training", trained, "  (samples/s)"),
    ):
        got = spread(values)
        print(
            f"{label} ratio ray_data / tuned DataLoader: median {got.median:.2f}"
            f" (range {got.lo:.2f}-{got.hi:.2f} over {got.n} rounds){goal}"
        )
    print(
        f"data wait, ray_data: {med('ray_data', 'wait'):.1%}, torch_loader: "
        f"{med('torch_loader', 'wait'):.1%}  (goal <= 5% when data workers suffice)"
    )


if __name__ == "__main__":
    main()
