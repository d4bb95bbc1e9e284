"""Expansion, exclusion, stable ids, capability refusals and the resource arithmetic."""

import pytest

from amdahl.errors import UserError
from amdahl.plan import DRIVER_CPUS, Node, plan_sweep
from amdahl.run import make_plan
from amdahl.spec import validate_spec
from workloads.mlp import MLP

TWO_CPUS = [Node(cpus=2.0)]


def _spec(**sections):
    return validate_spec({"name": "t", "workload": "mlp", **sections})


def _plan(nodes=TWO_CPUS, **sections):
    return plan_sweep(_spec(**sections), nodes, MLP.defaults)


def test_cartesian_product_minus_exclusions():
    plan = _plan(
        grid={"devices": [1, 2], "batch_size": [64, 128], "sync": ["ddp", "none"]},
        exclude=[{"devices": 1, "sync": "none"}],
        resources={"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    )
    labels = [t.settings for t in plan.trials]
    assert len(labels) == 8 - 2
    assert not any(s["devices"] == 1 and s["sync"] == "none" for s in labels)


def test_param_axes_reach_the_workload_params():
    plan = _plan(grid={"params.hidden": [[64], [128, 64]]})
    assert [t.settings["params"]["hidden"] for t in plan.trials] == [[64], [128, 64]]
    assert plan.trials[0].settings["params"]["inputs"] == 512  # defaults filled in


def test_ids_are_stable_and_independent_of_order():
    a = _plan(grid={"batch_size": [64, 128], "devices": [1]})
    b = _plan(grid={"batch_size": [128, 64], "devices": [1]})
    assert {t.trial_id for t in a.trials} == {t.trial_id for t in b.trials}
    assert len({t.trial_id for t in a.trials}) == 2
    c = _plan(grid={"batch_size": [64, 128]}, train={"steps": 99})
    assert not {t.trial_id for t in a.trials} & {t.trial_id for t in c.trials}


def test_options_only_enter_the_id_of_trials_that_use_them():
    a = _plan(grid={"sync": ["ddp", "none"]})
    b = _plan(grid={"sync": ["ddp", "none"]}, options={"bucket_cap_mb": 1})
    ids_a = {t.settings["sync"]: t.trial_id for t in a.trials}
    ids_b = {t.settings["sync"]: t.trial_id for t in b.trials}
    assert ids_a["none"] == ids_b["none"]
    assert ids_a["ddp"] != ids_b["ddp"]


def test_hang_case_a_no_cpu_left_for_ray_data():
    # Two 1-CPU workers on 2 CPUs leave Ray Data nothing: refused with the arithmetic and a fix.
    plan = _plan(grid={"devices": [1, 2]}, resources={"cpus_per_data_worker": 0.5})
    by_devices = {t.settings["devices"]: t for t in plan.trials}
    assert by_devices[1].refused is None
    reason = by_devices[2].refused
    assert reason is not None
    assert "2 x (1 CPU), data 0.5 CPU = 2.51 CPU, the cluster has 2 CPUs" in reason
    assert "input pipeline hangs" in reason
    assert "resources.cpus_per_device <= 0.74" in reason


def test_hang_case_b_the_driver_holds_only_a_fraction_of_a_cpu():
    plan = _plan(
        grid={"devices": [2]}, resources={"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5}
    )
    res = plan.trials[0].resources
    assert 0 < res.driver_cpus == DRIVER_CPUS < 0.1
    assert res.total_cpus == pytest.approx(1.51)
    assert plan.trials[0].refused is None


def test_gpus_missing_is_refused():
    plan = _plan(
        grid={"devices": [4]},
        resources={"use_gpu": True, "cpus_per_device": 0.1, "cpus_per_data_worker": 0.1},
    )
    assert "needs 4 GPUs (4 x 1), the cluster has 0" in plan.trials[0].refused


def test_each_worker_must_fit_on_one_node():
    nodes = [Node(cpus=8, gpus=1, name="a"), Node(cpus=8, gpus=1, name="b")]
    ok = _plan(nodes, grid={"devices": [2]}, resources={"use_gpu": True})
    assert ok.trials[0].refused is None
    too_big = _plan(nodes, grid={"devices": [4]}, resources={"use_gpu": True})
    assert "needs 4 GPUs" in too_big.trials[0].refused
    nodes = [Node(cpus=3, name="a"), Node(cpus=3, name="b")]
    split = _plan(
        nodes,
        grid={"devices": [2]},
        resources={"cpus_per_device": 2.5, "cpus_per_data_worker": 0.5},
    )
    assert split.trials[0].refused is None
    unsplittable = _plan(
        nodes, grid={"devices": [1]}, resources={"cpus_per_device": 4, "cpus_per_data_worker": 0.5}
    )
    assert "no node combination holds 1 workers of 4 CPU" in unsplittable.trials[0].refused


def test_cuda_only_values_refused_on_cpu_with_reason():
    plan = _plan(grid={"precision": ["fp32", "tf32"], "sync": ["ddp", "ddp_bf16"]})
    reasons = {(t.settings["precision"], t.settings["sync"]): t.refused for t in plan.trials}
    assert reasons[("fp32", "ddp")] is None
    assert "tf32 is a CUDA tensor-core math mode" in reasons[("tf32", "ddp")]
    assert "bf16_compress_hook needs CUDA and NCCL" in reasons[("fp32", "ddp_bf16")]
    gpus = [Node(cpus=8.0, gpus=2.0)]
    on_gpu = _plan(gpus, grid={"devices": [2], "sync": ["ddp_bf16"]}, resources={"use_gpu": True})
    assert on_gpu.trials[0].refused is None
    shared = _plan(
        gpus, grid={"devices": [1, 2]}, resources={"use_gpu": True, "gpus_per_device": 0.5}
    )
    assert shared.trials[0].refused is None  # one worker on half a GPU is fine
    assert "NCCL rejects (duplicate GPU)" in shared.trials[1].refused
    greedy = _plan(gpus, grid={"devices": [1]}, resources={"use_gpu": True, "gpus_per_device": 2})
    assert "each train worker drives one GPU" in greedy.trials[0].refused


def test_launches_group_trials_that_share_a_worker_group_shape():
    sections = {
        "grid": {"devices": [1, 2], "batch_size": [64, 128], "sync": ["ddp", "none"]},
        "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    }
    # One node, one launch at a time: every device count shares one worker group, sized to
    # its largest trial, trials fewest devices first.
    (shared,) = _plan(**sections).launches()
    assert [t.settings["devices"] for t in shared.trials] == [1, 1, 1, 1, 2, 2, 2, 2]
    assert shared.resources.workers == 2 and shared.device_counts == [1, 2]
    skip = {shared.trials[0].trial_id}
    assert [len(launch.trials) for launch in _plan(**sections).launches(skip)] == [7]
    assert len(_plan(**sections).launches(group=False)) == 8

    # Otherwise one worker group per device count: across nodes a subset's placement differs,
    # side-by-side launches would lose the idle ranks' resources, and a preprocessing
    # workload's streaming split is fixed to its group's size.
    two_nodes = [Node(cpus=2.0, name="a"), Node(cpus=2.0, name="b")]
    for plan in (
        _plan(two_nodes, **sections),
        _plan(**sections, isolation="shared"),
        plan_sweep(_spec(**sections), TWO_CPUS, MLP.defaults, preprocesses=True),
    ):
        launches = plan.launches()
        assert [len(launch.trials) for launch in launches] == [4, 4]
        assert [launch.device_counts for launch in launches] == [[1], [2]]
        assert [launch.resources.workers for launch in launches] == [1, 2]


def test_unknown_workload_params_are_rejected_before_launch():
    with pytest.raises(UserError, match="params.hiden: MLP has no parameter 'hiden'"):
        make_plan(_spec(params={"hiden": [8]}), TWO_CPUS)
    with pytest.raises(UserError, match="params.widht"):
        make_plan(_spec(grid={"params.widht": [1]}), TWO_CPUS)
    with pytest.raises(UserError, match="unknown workload 'mpl' \\(did you mean 'mlp'\\?\\)"):
        make_plan(validate_spec({"workload": "mpl"}), TWO_CPUS)
    with pytest.raises(UserError, match="cannot import 'no_such_pkg.mod'"):
        make_plan(validate_spec({"workload": "no_such_pkg.mod:Thing"}), TWO_CPUS)


def test_ids_of_earlier_sweeps_survive_new_train_fields():
    """Sweep directories from before lr_scaling/target keep their ids (resume finds them)."""
    spec = validate_spec({"workload": "mlp", "grid": {"devices": [1, 2]}})
    plan = plan_sweep(spec, [Node(cpus=4, gpus=0, name="n")], {})
    assert [t.trial_id for t in plan.trials] == ["ef13e2bca7", "2442a017a2"]
    target = {"metric": "val_loss", "value": 0.3, "max_steps": 400}
    for train in ({"target": target}, {"lr_scaling": "linear"}):
        changed = plan_sweep(
            validate_spec({"workload": "mlp", "grid": {"devices": [1, 2]}, "train": train}),
            [Node(cpus=4, gpus=0, name="n")],
            {},
        )
        assert not {t.trial_id for t in changed.trials} & {t.trial_id for t in plan.trials}
