"""Halving's continuation on a GPU (worker/resident.py): a kept trial's CUDA-event marks from its
first item still time the pooled window, its DDP on NCCL goes on, the ranks' agreement runs on
the device (NCCL reduces device tensors only), as does the worlds' group-name alignment, and the
budget is the GPU's memory."""

import pyarrow as pa
import torch
import torch.distributed as dist
from trial_runner import PARAMS, launch_config, trial_config

from amdahl.data.storage import arrow_column
from amdahl.worker.input import LoaderSource, validation_rows
from amdahl.worker.resident import RESIDENT_SHARE, ResidentTrials, _all_ranks_agree
from amdahl.worker.trial import KeptTrial, Placement, run_trial
from amdahl.worker.worlds import TrialWorlds
from workloads.mlp import MLP


def _source(workload: MLP) -> LoaderSource:
    rows = workload.generate("train", workload.params["train_rows"], seed=0)
    table = pa.table({k: arrow_column(v) for k, v in rows.items()})
    return LoaderSource(table, workload, rank=0, world=1, workers=0)


def test_a_continued_gpu_trial_pools_its_windows_on_the_device_timeline(cuda):
    workload, where = MLP(**PARAMS), Placement(cuda, 0, 1)
    val = validation_rows(workload, None, seed=0)
    trial = trial_config(sync="ddp")
    whole = run_trial(
        workload, trial, launch_config((trial,), steps=30), _source(workload), val, where
    )
    kept: list[KeptTrial] = []
    source = _source(workload)
    first = run_trial(
        workload, trial, launch_config((trial,), steps=10), source, val, where, keep=kept
    )
    other = trial_config(trial_id="other", precision="bf16")
    run_trial(workload, other, launch_config((other,)), _source(workload), val, where)
    second = run_trial(
        workload, trial, launch_config((trial,), steps=30), source, val, where, resume=kept[0]
    )
    assert second["windows"] == 2 and second["measured_steps"] == 30
    assert torch.allclose(
        torch.tensor(second["history"]["loss"]), torch.tensor(whole["history"]["loss"]), rtol=1e-4
    )
    assert second["warmup_s"] == first["warmup_s"]
    assert second["peak_mem_bytes"] == first["peak_mem_bytes"]
    # the other trial's seconds between the items are neither input wait nor elapsed time
    elapsed = second["history"]["elapsed_s"]
    assert elapsed == sorted(elapsed)
    assert max(second["history"]["data_wait_s"]) < 0.5 * (elapsed[-1] - elapsed[0])
    kept[0].close()


def test_the_ranks_agree_on_the_device_and_the_budget_is_the_gpus(cuda):
    assert _all_ranks_agree(True, 2, cuda) and not _all_ranks_agree(False, 2, cuda)
    # the group-name alignment's all-reduce on NCCL: a device tensor
    worlds = TrialWorlds(0, 1, 60, cuda)
    before = dist.distributed_c10d._world.group_count
    worlds.align_group_names()
    assert dist.distributed_c10d._world.group_count == before
    total = torch.cuda.get_device_properties(cuda).total_memory
    assert ResidentTrials(cuda, workers=4).budget_bytes == RESIDENT_SHARE * total
