"""Ray Data against a tuned torch DataLoader on the same preprocessing, side by side.

Both inputs are the platform's own (amdahl.data, amdahl.worker.input): the ResNet workload's
Fashion-MNIST-format rows (raw uint8 bytes in parquet), decoded, augmented and normalised by
`ResNet.preprocess`, fed as torch batches through `host_batches` (on CPU the device feed
passes them through):
  ray_data      the materialised rows + a map_batches operator of `workers` tasks, streamed by
                iter_torch_batches with prefetch (what a ray_data trial runs)
  torch_loader  a DataLoader over the same parquet with num_workers = `workers`, persistent
                workers, the same prefetch (what a torch_loader trial runs)
The DataLoader is tuned first: every num_workers from 1 to the CPU count is measured and the
fastest is kept; Ray Data then gets the same number of workers. Two consumers:
  ingest  a consumer that does nothing: rows/s over two epochs after a warmup
  train   the consumer trains ResNet-18 (one torch thread, like a platform worker): samples/s
          and data wait as a share of step time
Rounds interleave the two inputs (alternating which goes first); medians are printed with
the ratios. Goals (docs/architecture.md): Ray Data ingest >= 0.9x the DataLoader; data wait
<= 5% of step time when the data workers suffice.

    python benchmarks/input_pipeline.py [--rounds N] [--augment none|light|heavy] [--data DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from typing import Any

import torch

from amdahl.data.prepare import ray_dataset, with_preprocessing
from amdahl.data.storage import dataset_path
from amdahl.worker.input import LoaderSource, host_batches
from workloads.resnet import ResNet

CPU = torch.device("cpu")


def _source(name: str, base: Any, workload: ResNet, path: str, workers: int, args) -> Any:
    if name == "ray_data":
        ds = with_preprocessing(
            base, workload, workers, args.cpus_per_worker, args.batch, rows_per_pass=0
        )
        return ds.iterator()
    return LoaderSource(path, workload, rank=0, world=1, workers=workers)


def ingest(name: str, base: Any, workload: ResNet, path: str, workers: int, args) -> float:
    """Rows/s into a consumer that does nothing (two epochs, after warmup batches)."""
    batches = host_batches(
        _source(name, base, workload, path, workers, args), args.batch, args.prefetch, False
    )
    for _ in range(args.warmup):
        next(batches)
    count = 2 * (args.rows // args.batch)
    start = time.perf_counter()
    for _ in range(count):
        next(batches)
    rows_per_s = count * args.batch / (time.perf_counter() - start)
    batches.close()
    return rows_per_s


def train(
    name: str, base: Any, workload: ResNet, path: str, workers: int, args
) -> tuple[float, float]:
    """(data wait / step time, samples/s) while the consumer trains ResNet-18."""
    batches = host_batches(
        _source(name, base, workload, path, workers, args), args.batch, args.prefetch, False
    )
    torch.manual_seed(0)
    model = workload.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    waits, steps = [], []
    for step in range(args.warmup + args.train_steps):
        t0 = time.perf_counter()
        x, y = workload.split_batch(next(batches))
        t1 = time.perf_counter()
        loss = workload.loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if step >= args.warmup:
            waits.append(t1 - t0)
            steps.append(t2 - t0)
    batches.close()
    return sum(waits) / sum(steps), args.batch * len(steps) / sum(steps)


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
    parser.add_argument("--warmup", type=int, default=4, help="batches before timing")
    parser.add_argument("--cpus-per-worker", type=float, default=0.5)
    parser.add_argument("--data", default=None, help="params.data: your own train/ val/ parquet")
    parser.add_argument("--workers", type=int, default=None, help="skip tuning: use this many")
    args = parser.parse_args()

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
    path = dataset_path(workload, "resnet", "train", seed=0)
    base = ray_dataset(path, args.cpus_per_worker)
    if args.data:
        args.rows = base.count()

    print(
        f"{args.rows} rows, batch {args.batch}, prefetch {args.prefetch}, augment {args.augment}"
        f" (ops {args.augment_ops}), ResNet-18 width {args.width}, {cpus} CPUs"
    )
    workers = args.workers
    if workers is None:
        tried = range(1, cpus + 1)
        tuning = {w: ingest("torch_loader", base, workload, path, w, args) for w in tried}
        workers = max(tuning, key=tuning.get)
        print(
            "tuned DataLoader: "
            + ", ".join(f"num_workers={w}: {v:,.0f} rows/s" for w, v in tuning.items())
            + f" -> {workers}"
        )

    names = ("ray_data", "torch_loader")
    rows: dict[str, list[float]] = {n: [] for n in names}
    waits: dict[str, list[float]] = {n: [] for n in names}
    trained: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            rows[name].append(ingest(name, base, workload, path, workers, args))
        for name in order:
            wait, samples_per_s = train(name, base, workload, path, workers, args)
            waits[name].append(wait)
            trained[name].append(samples_per_s)
        print(
            f"round {r + 1}: "
            + "  ".join(
                f"{n} {rows[n][-1]:,.0f} rows/s, data wait {waits[n][-1]:.1%}" for n in names
            ),
            flush=True,
        )

    med = {n: statistics.median(rows[n]) for n in names}
    wait = {n: statistics.median(waits[n]) for n in names}
    fit = {n: statistics.median(trained[n]) for n in names}
    ratio = med["ray_data"] / med["torch_loader"]
    print(f"\nmedians over {args.rounds} interleaved rounds, {workers} data workers each:")
    for n in names:
        print(
            f"  {n:13s} ingest {med[n]:>8,.0f} rows/s   training {fit[n]:>6,.0f} samples/s,"
            f" data wait {wait[n]:6.1%} of step time"
        )
    print(f"ingest ratio ray_data / tuned DataLoader: {ratio:.2f}  (goal >= 0.9)")
    trained_ratio = fit["ray_data"] / fit["torch_loader"]
    print(f"training ratio ray_data / tuned DataLoader: {trained_ratio:.2f}  (samples/s)")
    print(
        f"data wait, ray_data: {wait['ray_data']:.1%}, torch_loader: {wait['torch_loader']:.1%}"
        "  (goal <= 5% when data workers suffice)"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
