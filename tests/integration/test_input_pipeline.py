"""The input pipeline on local Ray: ResNet-18 on Fashion-MNIST-format data through the platform
with both inputs, two devices and one or two data workers on two CPUs, and a starved
configuration whose data wait shows against a fed one."""

import pytest
import torch
from idx_files import write_fashion_mnist
from trial_runner import launch_config, trial_config

from amdahl import read_results, run_sweep, validate_spec
from amdahl.data.fashion_mnist import convert_fashion_mnist
from amdahl.data.prepare import ray_dataset, with_preprocessing
from amdahl.data.storage import stored_dataset
from amdahl.worker.input import LoaderSource, validation_rows
from amdahl.worker.trial import Placement, TrialRun, run_trial
from workloads.resnet import ResNet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fashion_mnist(tmp_path_factory):
    """Fashion-MNIST-format IDX files (learnable images) converted by the platform to parquet."""
    tmp = tmp_path_factory.mktemp("fmnist")
    write_fashion_mnist(tmp / "idx", n_train=320, n_val=64)
    convert_fashion_mnist(tmp / "idx", tmp / "parquet")
    return tmp / "parquet"


def test_resnet_on_fashion_mnist_format_data_with_both_inputs(ray_cluster, tmp_path, fashion_mnist):
    spec = validate_spec(
        {
            "name": "inputs",
            "workload": "resnet",
            "params": {"data": str(fashion_mnist), "width": 4, "augment": "light"},
            "train": {"steps": 4, "warmup_steps": 2},
            "grid": {
                "devices": [2],
                "batch_size": [16],
                "data_workers": [1, 2],
                "input": ["ray_data", "torch_loader"],
                "prefetch_batches": [2],
            },
            # 2 workers x 0.5 + data_workers x 0.4 (+ the driver's 0.01) on 2 CPUs.
            "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.4},
        }
    )
    outcome = run_sweep(spec, runs_dir=tmp_path, tracking=False)
    # A DataLoader with 2 workers on each of 2 devices needs 1.6 data CPUs: refused, with why.
    [refused] = outcome.plan.refused
    assert (refused.settings.input, refused.settings.data_workers) == ("torch_loader", 2)
    assert "the input pipeline must keep 1.6 CPU beside the train workers" in refused.refused
    rows = read_results(outcome.sweep_dir).to_pylist()
    got = {(r["input"], r["data_workers"]) for r in rows}
    assert got == {("ray_data", 1), ("ray_data", 2), ("torch_loader", 1)}
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert r["devices"] == 2 and r["prefetch_batches"] == 2
        # a step's input wait is part of the step: at most the window's seconds per step
        assert r["throughput"] > 0 and r["data_wait_s"] <= r["measured_s"] / r["steps"]
        assert 0.0 <= r["val_accuracy"] <= 1.0  # over the 64 converted t10k rows
        # counted by the worker, and equal to the figure the workload states
        assert r["flops_source"] == "counted" and r["flops_count_s"] is not None
        assert r["flops_per_sample"] == r["flops_stated"] == ResNet(width=4).flops_per_sample()


# --------------------------------------------------------------------------- data wait

#: Per image, ~48 RandAugment-style operations (~2 ms here): one data worker cannot keep up
#: with a tiny ResNet-18, which trains at roughly 2,000 images/s on one CPU thread.
STARVED = {"augment": "heavy", "augment_ops": 48}
FED = {"augment": "none"}
SETTINGS = {
    "devices": 1,
    "batch_size": 64,
    "per_device_batch": 64,
    "precision": "fp32",
    "compile": "eager",
    "data_workers": 1,
    "prefetch_batches": 2,
    "sync": "none",
    "input": "ray_data",
    "options": {},
}


def _data_wait(input_name: str, params: dict) -> dict:
    """One trial of the harness in this process on the given input (no Train worker group).

    8192 rows are four 2048-row Ray Data tasks: the measured steps outrun what was
    preprocessed while the pipeline started."""
    workload = ResNet(width=4, train_rows=8192, val_rows=64, **params)
    path = str(stored_dataset(workload, "resnet", "train", 0))
    if input_name == "ray_data":
        source = with_preprocessing(
            ray_dataset(path, 0.4), workload, 1, 0.4, 64, rows_per_pass=0
        ).iterator()
    else:
        source = LoaderSource(path, workload, rank=0, world=1, workers=1)
    torch.set_num_threads(1)
    val = validation_rows(workload, None, seed=0)
    trial = trial_config({**SETTINGS, "params": workload.params})
    launch = launch_config((trial,), steps=40, warmup_steps=2)
    return run_trial(
        TrialRun(workload, trial, launch, source, val, Placement(torch.device("cpu"), 0, 1))
    )


@pytest.mark.parametrize("input_name", ["torch_loader", "ray_data"])
def test_starved_data_wait_shows_against_a_fed_one(ray_cluster, input_name):
    # Fed first: a starved run's last preprocessing task may still be finishing after it.
    fed = _data_wait(input_name, FED)
    starved = _data_wait(input_name, STARVED)
    # Starved: steps wait for images; fed: the next batch is ready when the step ends.
    assert starved["data_wait_s"] > 3 * fed["data_wait_s"]
    assert starved["data_wait_s"] > 0.25 * starved["step_time_s"]
    assert fed["data_wait_s"] < 0.2 * fed["step_time_s"]


def test_local_parquet_reaches_workers_without_their_disk(ray_cluster, tmp_path):
    """On a cluster, the driver's local files are not on the other nodes: the driver reads them
    into the object store, and workers only ever see object references. Proven here by
    deleting the files before any worker reads (a Ray task stands in for a remote worker)."""
    import shutil

    import numpy as np
    import ray

    from amdahl.data.prepare import rank_shards, repeat_to_cover
    from amdahl.data.storage import put_rows, read_rows
    from amdahl.worker.input import LoaderSource

    workload = ResNet(train_rows=4096, val_rows=64, augment="none")
    path = stored_dataset(workload, "resnet", "train", 0, cache=tmp_path)
    expected = read_rows(str(path))["label"]
    rows, dataset = put_rows(str(path)), ray_dataset(path, 0.5)
    shards = [repeat_to_cover(s, 3000) for s in rank_shards(dataset, 2)]
    shutil.rmtree(path)

    @ray.remote(num_cpus=0.1)
    def on_another_node(boxed, shard) -> tuple[list[int], int, list[int]]:
        (rows,) = boxed  # nested, as in a launch's config, so Ray passes the reference itself
        loader = LoaderSource(rows, workload, rank=1, world=2, workers=0).table()
        streamed = sum(len(b["label"]) for b in shard.iterator().iter_batches(batch_size=512))
        return loader["label"].to_pylist(), streamed, read_rows(rows)["label"].tolist()

    loader_labels, streamed, all_labels = ray.get(on_another_node.remote([rows], shards[1]))
    assert all_labels == expected.tolist()
    assert loader_labels == expected[2048:].tolist()  # rank 1's contiguous half
    assert streamed == 2048 * 3  # its half, repeated: 3000 rows need 2 epochs + 1 spare
    np.testing.assert_array_equal(sorted(all_labels), sorted(expected.tolist()))
