"""Is a trial's `peak_mem_bytes` the tensor bytes a device would hold? Against torch's MemTracker.

For each workload (the D2L MLP, the small GPT, the two-layer encoder of the memory tests),
precision (fp32, bf16 autocast), batch size and sync (none, ddp at one rank), two arms on the
same model, batch, optimizer (SGD, momentum 0.9) and precision, one process:
  platform    a trial through `worker.trial.run_trial` (tests/trial_runner.py: a DataLoader over
              the workload's rows, 3 warmup steps): `peak_mem_bytes`, the tensor ledger's peak
              over the last warmup step
  memtracker  torch.distributed._tools.mem_tracker.MemTracker over one step of a plain loop
              after a first step (the optimizer state exists, as after a trial's warmup); under
              ddp plus DDP's gradient buckets, which MemTracker cannot see (C++ allocations
              made when DDP is built: `worker.tensor_ledger.sync_buffer_bytes`, checked against
              what the ledger sees DDP allocate in tests/unit/worker/test_tensor_ledger.py)
Prints one line per case: both peaks in MiB and platform / memtracker; then the median and worst
|ratio - 1|. The goal: within 10% on every case. (Resident memory is no comparison here: every
case runs in one process, whose heap the first cases already grew.)

    python benchmarks/memory_check.py [--batches 16,64,256] [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _harness import add_smoke_flag, print_stamp  # noqa: E402
from encoder_workload import TinyEncoder  # noqa: E402
from memtracker_reference import memtracker_peak  # noqa: E402
from trial_runner import launch_config, one_rank_group, run, trial_config  # noqa: E402

from amdahl import Workload  # noqa: E402
from workloads.gpt import GPT  # noqa: E402
from workloads.mlp import MLP  # noqa: E402

WORKLOADS = {
    "mlp": lambda: MLP(train_rows=2048, val_rows=256),
    "gpt": lambda: GPT(train_rows=1024, val_rows=128),
    "encoder": TinyEncoder,
}


def platform_arm(workload: Workload, batch: int, precision: str, sync: str) -> dict:
    settings = dict(batch_size=batch, per_device_batch=batch, precision=precision, sync=sync)
    trial = trial_config(**settings, params=workload.params)
    launch = launch_config((trial,), steps=4, warmup_steps=3, profile_steps=0)
    stats, error, _ = run(workload, torch.device("cpu"), launch, params=workload.params, **settings)
    if error:
        raise RuntimeError(error)
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="16,64,256")
    add_smoke_flag(ap)
    ap.add_argument("--quick", action="store_true", help="one batch, fp32, sync none")
    args = ap.parse_args()
    args.quick = args.quick or args.smoke
    print_stamp()
    batches = [int(b) for b in args.batches.split(",")][: 1 if args.quick else None]
    precisions = ["fp32"] if args.quick else ["fp32", "bf16"]
    syncs = ["none"] if args.quick else ["none", "ddp"]
    torch.set_num_threads(1)
    one_rank_group("gloo")
    print("one process, one thread")
    print(
        f"{'case':32s} {'platform MiB':>12s} {'memtracker':>10s} {'ratio':>7s} {'rss/tensor':>10s}"
    )
    errors = []
    for name, make in WORKLOADS.items():
        for precision in precisions:
            for sync in syncs:
                for batch in batches:
                    workload = make()
                    stats = platform_arm(workload, batch, precision, sync)
                    reference = memtracker_peak(workload, batch, precision, sync)
                    ratio = stats["peak_mem_bytes"] / reference
                    errors.append(abs(ratio - 1))
                    case = f"{name} {precision} {sync} b{batch}"
                    print(
                        f"{case:32s} {stats['peak_mem_bytes'] / 2**20:12.2f} "
                        f"{reference / 2**20:10.2f} {ratio:7.4f}"
                    )
    print(
        f"{len(errors)} cases: median |ratio - 1| {statistics.median(errors):.2%}, "
        f"worst {max(errors):.2%} (goal: <= 10% on every case)"
    )


if __name__ == "__main__":
    main()
