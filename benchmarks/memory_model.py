"""The memory model's predicted peak per rank against the measured one, before any trial runs.

Cases: workloads (the D2L MLP, the small GPT, the memory tests' two-layer encoder) x sync
(none, ddp, zero1, fsdp, accumulate) x precision (fp32, bf16) x per-device batch (16, 64, 256)
x ranks (1, 2), SGD with momentum; and fsdp with its options (reshard_after_forward false,
param_dtype bf16, both) over the same workloads, precisions and batches. For each:
  predicted  analysis.memory_model.predict_peak over the memory probe's facts
             (worker/memory_probe.py: the plain model at batches 2 and 8), what `platform plan`
             shows
  measured   `peak_mem_bytes` of the trial run through `worker.trial.run_trial` in plain gloo
             processes over loopback (one per rank, no Ray), the largest over ranks: the tensor
             ledger over the last of 3 warmup steps (benchmarks/memory_check.py checks that
             figure against torch's MemTracker)
Prints each case's predicted and measured MiB and the error (predicted / measured - 1), then the
median and p90 of |error| and the worst under-prediction (an under-prediction is an OOM). Goal:
median <= 10%, p90 <= 20%, none under by more than 10%.

    python benchmarks/memory_model.py [--quick] [--fsdp-options]
        # --quick: the GPT, fp32, batch 64; --fsdp-options: only fsdp's option cases
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _harness import add_smoke_flag, print_stamp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit" / "worker"))
from encoder_workload import TinyEncoder  # noqa: E402
from gloo_ranks import spawn_ranks  # noqa: E402
from trial_runner import launch_config, settings, trial_config  # noqa: E402

from amdahl.analysis.memory_model import MemoryFacts, predict_peak  # noqa: E402
from amdahl.data.storage import arrow_column  # noqa: E402
from amdahl.strategies import micro_steps  # noqa: E402
from amdahl.worker.input import LoaderSource, validation_rows  # noqa: E402
from amdahl.worker.memory_probe import probe_memory  # noqa: E402
from amdahl.worker.trial import Placement, TrialRun, run_trial_guarded  # noqa: E402
from workloads.gpt import GPT  # noqa: E402
from workloads.mlp import MLP  # noqa: E402

WORKLOADS = {
    "mlp": lambda: MLP(train_rows=4096, val_rows=128),
    "gpt": lambda: GPT(train_rows=4096, val_rows=128),
    "encoder": lambda: TinyEncoder(train_rows=4096, val_rows=128),
}
SYNCS = ("none", "ddp", "zero1", "fsdp", "accumulate")
PRECISIONS = ("fp32", "bf16")
BATCHES = (16, 64, 256)
#: fsdp's option cases, by label (each beside the default "-").
FSDP_OPTIONS = {
    "-": {},
    "noreshard": {"fsdp_reshard_after_forward": False},
    "param-bf16": {"fsdp_param_dtype": "bf16"},
    "noreshard,param-bf16": {"fsdp_reshard_after_forward": False, "fsdp_param_dtype": "bf16"},
}


def cases(quick: bool, fsdp_options: bool = False) -> list[tuple[str, str, str, int, str]]:
    """(workload, sync, precision, batch, FSDP_OPTIONS label) of every case to run (with
    `fsdp_options`, fsdp's alone, its default included; `quick` alone: one of its options)."""
    if quick:
        plain = [("gpt", sync, "fp32", 64, "-") for sync in SYNCS]
        fsdp = [("gpt", "fsdp", "fp32", 64, label) for label in FSDP_OPTIONS]
        if not fsdp_options:
            fsdp = fsdp[-1:]
    else:
        plain = [(*c, "-") for c in itertools.product(WORKLOADS, SYNCS, PRECISIONS, BATCHES)]
        fsdp = list(itertools.product(WORKLOADS, ["fsdp"], PRECISIONS, BATCHES, FSDP_OPTIONS))
    return fsdp if fsdp_options else plain + [c for c in fsdp if c[4] != "-"]


def measure(rank: int, world: int, port: int, out, quick: bool, fsdp_options: bool) -> None:
    """One rank: every case in order, in one gloo world of `world` ranks."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    where = Placement(torch.device("cpu"), rank, world)
    for name, sync, precision, batch, label in cases(quick, fsdp_options):
        workload = WORKLOADS[name]()
        rows = workload.generate("train", workload.params["train_rows"], seed=0)
        import pyarrow as pa

        table = pa.table({k: arrow_column(v) for k, v in rows.items()})
        source = LoaderSource(table, workload, rank=rank, world=world, workers=0)
        trial_settings = dict(
            devices=world,
            batch_size=batch,
            per_device_batch=batch,
            precision=precision,
            sync=sync,
            params=workload.params,
            options={**settings()["options"], **FSDP_OPTIONS[label]},
        )
        trial = trial_config(**trial_settings)
        launch = launch_config((trial,), steps=3, warmup_steps=3, profile_steps=0)
        val = validation_rows(workload, None, seed=0)
        stats, error, _ = run_trial_guarded(TrialRun(workload, trial, launch, source, val, where))
        case = (name, sync, precision, batch, label)
        out.put((rank, case, stats.get("peak_mem_bytes"), error))
    dist.destroy_process_group()


def predicted(
    name: str, sync: str, precision: str, batch: int, label: str, ranks: int, cache: Path
) -> float:
    workload = WORKLOADS[name]()
    facts = MemoryFacts.from_dict(probe_memory(workload, precision, "sgd", 0, cache))
    micro = micro_steps(sync, {"accumulate_steps": 2}, 1)
    options = FSDP_OPTIONS[label]
    peak = predict_peak(facts, sync, ranks, batch, micro, options=options, precision=precision)
    return peak.total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_smoke_flag(ap)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fsdp-options", action="store_true", help="only fsdp's option cases")
    args = ap.parse_args()
    args.quick = args.quick or args.smoke
    print_stamp()
    print("gloo ranks on loopback, one thread each")
    cache = Path(tempfile.mkdtemp(prefix="amdahl-probe-"))
    errors: list[float] = []
    print(f"{'case':56s} {'predicted MiB':>13s} {'measured MiB':>12s} {'error':>7s}")
    chosen = cases(args.quick, args.fsdp_options)
    for ranks in (1, 2):
        run = functools.partial(measure, quick=args.quick, fsdp_options=args.fsdp_options)
        procs, out = spawn_ranks(run, ranks)
        n = len(chosen)
        got: dict[tuple, list] = {}
        for _ in range(n * ranks):
            rank, case, peak, error = out.get(timeout=1800)
            got.setdefault(case, []).append((peak, error))
        for p in procs:
            p.join(timeout=60)
        for case in chosen:
            failures = [e for _, e in got[case] if e]
            label = f"{' '.join(map(str, case))} p{ranks}"
            if failures:
                print(f"{label:56s} failed: {failures[0].splitlines()[0][:80]}")
                continue
            measured = max(peak for peak, _ in got[case])
            guess = predicted(*case, ranks, cache)
            errors.append(guess / measured - 1)
            print(f"{label:56s} {guess / 2**20:13.2f} {measured / 2**20:12.2f} {errors[-1]:+7.1%}")
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))]
    print(
        f"{len(errors)} cases: median |error| {statistics.median(absolute):.1%}, p90 {p90:.1%}, "
        f"worst under-prediction {min(errors):+.1%} (goal: 10% / 20%, none under -10%)"
    )


if __name__ == "__main__":
    main()
