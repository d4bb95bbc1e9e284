"""The input and prefetch_batches axes in the spec and the plan, and the CPUs kept for data."""

import pytest

from amdahl.errors import UserError
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import Node
from amdahl.spec.load import validate_spec
from workloads.resnet import ResNet

TWO_CPUS = [Node(cpus=2.0)]


def _plan(**sections):
    spec = validate_spec({"name": "t", "workload": "resnet", **sections})
    return plan_sweep(spec, TWO_CPUS, WorkloadFacts(ResNet.defaults))


def test_axes_default_to_ray_data_with_four_batches_prefetched():
    trial = _plan().trials[0]
    assert trial.settings.input == "ray_data"
    assert trial.settings.prefetch_batches == 4
    assert "prefetch_batches" not in trial.settings.options


def test_bad_axis_values_are_refused_with_the_allowed_ones():
    with pytest.raises(UserError, match=r"grid.input\[0\]: got 'dataloader'.*torch_loader"):
        validate_spec({"workload": "resnet", "grid": {"input": ["dataloader"]}})
    with pytest.raises(UserError, match=r"grid.prefetch_batches\[0\]: must be >= 0, got -1"):
        validate_spec({"workload": "resnet", "grid": {"prefetch_batches": [-1]}})
    with pytest.raises(UserError, match="options.prefetch_batches: unknown key"):
        validate_spec({"workload": "resnet", "options": {"prefetch_batches": 2}})


def test_input_splits_launches_and_prefetch_does_not():
    plan = _plan(
        grid={"input": ["ray_data", "torch_loader"], "prefetch_batches": [0, 4]},
        resources={"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    )
    assert len(plan.runnable) == 4 and len({t.trial_id for t in plan.trials}) == 4
    launches = plan.launches()
    assert len(launches) == 2
    assert [{t.settings.input for t in launch.trials} for launch in launches] == [
        {"ray_data"},
        {"torch_loader"},
    ]
    # Both axes leave their defaults somewhere, so every label names both, defaults included.
    assert sorted(plan.labels.values()) == [
        "d1 b256 fp32 eager w1 ddp ray_data p0",
        "d1 b256 fp32 eager w1 ddp ray_data p4",
        "d1 b256 fp32 eager w1 ddp torch_loader p0",
        "d1 b256 fp32 eager w1 ddp torch_loader p4",
    ]


def test_two_devices_on_two_cpus_keep_cpus_for_one_or_two_data_workers():
    plan = _plan(
        grid={"devices": [2], "data_workers": [1, 2], "input": ["ray_data", "torch_loader"]},
        resources={"cpus_per_device": 0.5, "cpus_per_data_worker": 0.4},
    )
    by = {(t.settings.input, t.settings.data_workers): t for t in plan.trials}
    # Ray Data: one operator of data_workers tasks for both devices.
    assert by[("ray_data", 1)].refused is None
    assert by[("ray_data", 2)].refused is None
    assert by[("ray_data", 2)].resources.data_cpus == pytest.approx(0.8)
    # torch_loader: a DataLoader with data_workers processes on each device.
    assert by[("torch_loader", 1)].resources.data_cpus == pytest.approx(0.8)
    assert by[("torch_loader", 1)].refused is None
    reason = by[("torch_loader", 2)].refused
    assert "data 1.6 CPU = 2.61 CPU, the cluster has 2 CPUs" in reason
    assert "the input pipeline must keep 1.6 CPU beside the train workers" in reason


def test_half_a_cpu_per_data_worker_does_not_fit_two_of_them_beside_two_devices():
    plan = _plan(
        grid={"devices": [2], "data_workers": [1, 2]},
        resources={"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    )
    by = {t.settings.data_workers: t for t in plan.trials}
    assert by[1].refused is None
    assert "= 2.01 CPU, the cluster has 2 CPUs" in by[2].refused
    assert "set resources.cpus_per_device <= 0.49" in by[2].refused


def test_no_data_workers_loads_in_the_training_process_and_only_for_the_dataloader():
    plan = _plan(
        grid={"devices": [2], "data_workers": [0, 1], "input": ["ray_data", "torch_loader"]},
        resources={"cpus_per_device": 0.5, "cpus_per_data_worker": 0.4},
    )
    by = {(t.settings.input, t.settings.data_workers): t for t in plan.trials}
    assert by[("torch_loader", 0)].refused is None
    assert by[("torch_loader", 0)].resources.data_cpus == 0  # no worker processes to keep
    assert "data_workers=0 with input=ray_data" in by[("ray_data", 0)].refused
    assert "0 (batches made in the training process) is for input torch_loader" in (
        by[("ray_data", 0)].refused
    )
    assert by[("ray_data", 1)].refused is None
    with pytest.raises(UserError, match=r"grid.data_workers\[0\]: must be >= 0, got -1"):
        validate_spec({"workload": "resnet", "grid": {"data_workers": [-1]}})
