"""Trials on one GPU, in this process, through the same harness the Ray workers run."""

import itertools
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from trial_runner import PARAMS, SlowData, SlowForward, launch_config, run, settings, trial_config

from amdahl import strategies
from amdahl.worker.feed import DeviceFeed
from amdahl.worker.peak import measure_peak_flops
from amdahl.worker.rows import aggregate_ranks
from workloads.mlp import MLP

PRECISIONS = ["fp32", "tf32", "bf16", "fp16", "bf16_weights"]
COMPILES = ["eager", "inductor", "torchscript"]
#: Every strategy in the table (a new one joins the matrix by its row in strategies.py).
SYNCS = list(strategies.NAMES)
#: A model big enough that its matmuls are not all launch overhead (MFU well above 0).
BIG = {**PARAMS, "inputs": 1024, "hidden": [2048, 2048], "train_rows": 8192}


@pytest.fixture(scope="module")
def ray_for_param_server():
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize(
    "precision, compile_, sync",
    [
        combination
        for combination in itertools.product(PRECISIONS, COMPILES, SYNCS)
        # refused at plan time (plan.INCOMPATIBLE): FSDP2's hooks on a TorchScript module
        if combination[1:] != ("torchscript", "fsdp")
    ],
)
def test_every_precision_compile_and_sync_runs_on_one_gpu(cuda, request, precision, compile_, sync):
    if sync == "param_server":
        request.getfixturevalue("ray_for_param_server")
    workload = MLP(**BIG)
    options = {**settings()["options"], "compile_cache": "warm"}  # the matrix, not compile_s
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    stats, error, kind = run(
        workload, cuda, precision=precision, compile=compile_, sync=sync, options=options
    )
    assert error is None, error
    assert dist.get_backend() == "nccl"
    assert stats["peak_mem_bytes"] > 0
    assert stats["transfer_s"] is not None and stats["transfer_s"] > 0
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == flags
    trial = trial_config(precision=precision, flops_per_sample=workload.flops_per_sample())
    row = aggregate_ranks([stats], trial, launch_config())
    assert row["status"] == "ok"
    assert 0 < row["mfu"] < 1, row["mfu"]


def test_a_slow_forward_is_forward_time_on_the_device_timeline(cuda):
    stats, error, _ = run(SlowForward(**PARAMS), cuda)
    assert error is None, error
    assert stats["forward_s"] >= 0.9 * SlowForward.FORWARD_S
    assert stats["data_wait_s"] < SlowForward.FORWARD_S / 4


def test_slow_input_is_the_device_idle_gap(cuda):
    stats, error, _ = run(SlowData(**PARAMS), cuda)
    assert error is None, error
    assert stats["data_wait_s"] >= 0.8 * SlowData.DATA_S
    assert stats["step_time_s"] < SlowData.DATA_S / 2


def test_a_host_wait_hidden_behind_gpu_work_is_not_data_wait(cuda):
    class SlowBoth(SlowForward, SlowData):
        FORWARD_S = 0.04
        DATA_S = 0.01

    stats, error, _ = run(SlowBoth(**PARAMS), cuda)
    assert error is None, error
    assert stats["data_wait_host_s"] >= 0.8 * SlowBoth.DATA_S  # the host did wait
    assert stats["data_wait_s"] < SlowBoth.DATA_S / 2  # but the GPU never did


def test_the_feed_copies_ahead_on_a_side_stream(cuda):
    n = 8 * 2**20  # 32 MiB of float32 per batch: a copy long enough to time
    host = [{"x": torch.full((n,), float(i)).pin_memory()} for i in range(3)]
    feed = DeviceFeed(iter(host), cuda)
    host_start = time.perf_counter()  # batch 1's copy is issued inside the first next()
    first = next(feed)
    assert first["x"].is_cuda and feed.last_copy is not None
    second = next(feed)
    torch.cuda.synchronize()
    host_s = time.perf_counter() - host_start
    assert bool((first["x"] == 0).all()) and bool((second["x"] == 1).all())
    start, end = feed.last_copy  # batch 1's
    copy_s = start.elapsed_time(end) / 1e3
    # The events bracket the copy itself: 32 MiB in less time would be faster than 1 TB/s,
    # which no host link is (events recorded around nothing read microseconds), and the
    # copy lies inside the host's own bracket around it.
    assert 4 * n / 1e12 < copy_s <= host_s, (copy_s, host_s)


def test_tf32_has_its_own_peak_and_the_probe_leaves_no_memory(cuda):
    before = torch.cuda.memory_allocated(cuda)
    fp32, tf32, bf16 = (measure_peak_flops(cuda, p) for p in ("fp32", "tf32", "bf16"))
    assert tf32 > 1.5 * fp32 and bf16 > 1.5 * fp32
    assert torch.cuda.memory_allocated(cuda) == before
    assert not torch.backends.cuda.matmul.allow_tf32


def test_an_oom_trial_then_a_normal_trial_in_one_process(cuda):
    class Huge(MLP):
        def build_model(self):
            free, _ = torch.cuda.mem_get_info()
            side = int((free / 4) ** 0.5) + 1024  # one layer larger than the free memory
            # Built on the GPU: on the host, initialising it would take minutes.
            huge = torch.nn.Linear(side, side, device="cuda")
            return torch.nn.Sequential(huge, super().build_model())

    before, error, _ = run(MLP(**PARAMS), cuda)
    assert error is None, error
    # What stays allocated between trials (cuBLAS workspaces, NCCL buffers) is not a trial's.
    resident = torch.cuda.memory_allocated(cuda)
    _, error, kind = run(Huge(**PARAMS), cuda)
    assert kind == "oom" and error.startswith("oom: ")
    after, error, _ = run(MLP(**PARAMS), cuda)
    assert error is None, error
    assert torch.cuda.memory_allocated(cuda) <= resident + 2**20  # the OOM left nothing behind
    assert after["peak_mem_bytes"] == pytest.approx(before["peak_mem_bytes"], rel=0.05)


def test_cold_compile_caches_compile_again_and_warm_ones_reuse(cuda):
    cold = settings()["options"]
    warm = {**cold, "compile_cache": "warm"}
    first, e1, _ = run(MLP(**PARAMS), cuda, compile="inductor", options=warm)
    again, e2, _ = run(MLP(**PARAMS), cuda, compile="inductor", options=warm)
    fresh, e3, _ = run(MLP(**PARAMS), cuda, compile="inductor", options=cold)
    assert (e1, e2, e3) == (None, None, None)
    # Behaviour, not a timing threshold: a cold trial pays what the first warm one paid.
    assert fresh["compile_s"] > again["compile_s"]


def test_a_sticky_cuda_error_never_reaches_the_next_trial():
    """A device-side assert poisons the CUDA context. Either the harness classifies the trial
    'poisoned' (and the worker ends, see train_launch), or torch aborts the process itself
    (an error thrown from a CUDA destructor): in neither case does a next trial run on it."""
    script = textwrap.dedent(
        """
        import sys, torch
        sys.path[:0] = [{tests!r}]
        from trial_runner import PARAMS, run
        from workloads.mlp import MLP

        class BadLabels(MLP):
            def loss(self, output, target):
                return torch.nn.functional.nll_loss(output, target + 1000)

        _, error, kind = run(BadLabels(**PARAMS), torch.device("cuda", 0))
        print("KIND", kind, flush=True)
        """
    ).format(tests=str(Path(__file__).parents[1]))
    command = [sys.executable, "-c", script]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    classified = "KIND poisoned" in out.stdout
    aborted = out.returncode != 0 and "device-side assert" in out.stderr
    assert classified or aborted, out.stdout + out.stderr[-2000:]
