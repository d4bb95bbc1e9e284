"""Halving's continuation on a GPU (worker/resident.py): a kept trial's CUDA-event marks from its
first item still time the pooled window, its DDP on NCCL goes on, the ranks' agreement runs on
the device (NCCL reduces device tensors only), as does the worlds' group-name alignment, and the
budget is the GPU's memory."""

import torch
import torch.distributed as dist
from trial_runner import PARAMS, continued_and_whole, trial_config

from amdahl.worker.resident import RESIDENT_SHARE, ResidentTrials, _all_ranks_agree
from amdahl.worker.trial import Placement, TrialRun
from amdahl.worker.worlds import TrialWorlds
from workloads.mlp import MLP


def test_a_continued_gpu_trial_pools_its_windows_on_the_device_timeline(cuda):
    trial, other = trial_config(sync="ddp"), trial_config(trial_id="other", precision="bf16")
    whole, first, second, kept = continued_and_whole(
        MLP(**PARAMS), trial, other, Placement(cuda, 0, 1)
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
    kept.close()


def test_the_ranks_agree_on_the_device_and_the_budget_is_the_gpus(cuda):
    assert _all_ranks_agree(True, 2, cuda) and not _all_ranks_agree(False, 2, cuda)
    # the group-name alignment's all-reduce on NCCL: a device tensor
    worlds = TrialWorlds(0, 1, 60, cuda)
    before = dist.distributed_c10d._world.group_count
    worlds.align_group_names()
    assert dist.distributed_c10d._world.group_count == before
    total = torch.cuda.get_device_properties(cuda).total_memory
    assert ResidentTrials(cuda, workers=4).budget_bytes == RESIDENT_SHARE * total


def test_a_compiled_configurations_later_rung_loads_its_triton_kernels(cuda, tmp_path):
    """worker/compile_dirs.py on a GPU: an inductor trial compiled twice into its own directory
    (the per-trial reset between) finds its graphs the second time, and Triton's kernels were
    written under that directory, not the shared cache."""
    from torch._dynamo.utils import counters
    from trial_runner import launch_config, loader_source

    from amdahl.worker.input import validation_rows
    from amdahl.worker.trial import run_trial_guarded

    workload, trial = MLP(**PARAMS), trial_config(compile="inductor", precision="bf16")
    source, val = loader_source(workload), validation_rows(workload, None, seed=0)
    hits = []
    for _ in range(2):
        counters.clear()
        stats, error, _ = run_trial_guarded(
            TrialRun(
                workload,
                trial,
                launch_config((trial,)),
                source,
                val,
                Placement(cuda, 0, 1),
                compile_dir=tmp_path,
            )
        )
        assert error is None, error
        hits.append(counters["inductor"].get("fxgraph_cache_hit", 0))
    assert hits[0] == 0 and hits[1] >= 1
    assert any((tmp_path / "triton").rglob("*")), "Triton's kernels went elsewhere"
