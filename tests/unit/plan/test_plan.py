"""Expansion, exclusion, stable ids, capability refusals and the resource arithmetic."""

from dataclasses import dataclass, replace

import pyarrow as pa
import pytest

from amdahl.analysis.configs import group_configs
from amdahl.columns import AXES, AXIS_TABLE, COLUMNS, SCHEMA, Axis, TrialSettings
from amdahl.driver.planning import check_sweep
from amdahl.driver.trainable import launch_config
from amdahl.errors import UserError
from amdahl.plan import trials as planner
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import DRIVER_CPUS, Node
from amdahl.plan.trials import expand_grid, trial_id
from amdahl.protocol.contract import TrialConfig
from amdahl.protocol.identity import row_identity
from amdahl.spec.load import validate_spec
from amdahl.spec.schema import (
    GridSpec,
    OptionsSpec,
    ResourcesSpec,
    TargetSpec,
    TrainSpec,
)
from amdahl.sweepdir.driver_files import plan_summary, ray_storage
from workloads.mlp import MLP

TWO_CPUS = [Node(cpus=2.0)]


def _spec(**sections):
    return validate_spec({"name": "t", "workload": "mlp", **sections})


def _plan(nodes=TWO_CPUS, **sections):
    return plan_sweep(_spec(**sections), nodes, WorkloadFacts(MLP.defaults))


def test_cartesian_product_minus_exclusions():
    plan = _plan(
        grid={"devices": [1, 2], "batch_size": [64, 128], "sync": ["ddp", "none"]},
        exclude=[{"devices": 1, "sync": "none"}],
        resources={"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    )
    labels = [t.settings for t in plan.trials]
    assert len(labels) == 8 - 2
    assert not any(s.devices == 1 and s.sync == "none" for s in labels)


def test_param_axes_reach_the_workload_params():
    plan = _plan(grid={"params.hidden": [[64], [128, 64]]})
    assert [t.settings.params["hidden"] for t in plan.trials] == [[64], [128, 64]]
    assert plan.trials[0].settings.params["inputs"] == 512  # defaults filled in


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
    ids_a = {t.settings.sync: t.trial_id for t in a.trials}
    ids_b = {t.settings.sync: t.trial_id for t in b.trials}
    assert ids_a["none"] == ids_b["none"]
    assert ids_a["ddp"] != ids_b["ddp"]


def test_hang_case_a_no_cpu_left_for_ray_data():
    # Two 1-CPU workers on 2 CPUs leave Ray Data nothing: refused with the arithmetic and a fix.
    plan = _plan(
        grid={"devices": [1, 2]}, resources={"cpus_per_device": 1, "cpus_per_data_worker": 0.5}
    )
    by_devices = {t.settings.devices: t for t in plan.trials}
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
    reasons = {(t.settings.precision, t.settings.sync): t.refused for t in plan.trials}
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
    assert [t.settings.devices for t in shared.trials] == [1, 1, 1, 1, 2, 2, 2, 2]
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
        plan_sweep(_spec(**sections), TWO_CPUS, WorkloadFacts(MLP.defaults, preprocesses=True)),
    ):
        launches = plan.launches()
        assert [len(launch.trials) for launch in launches] == [4, 4]
        assert [launch.device_counts for launch in launches] == [[1], [2]]
        assert [launch.resources.workers for launch in launches] == [1, 2]


def test_unknown_workload_params_are_rejected_before_launch():
    with pytest.raises(UserError, match="params.hiden: MLP has no parameter 'hiden'"):
        check_sweep(_spec(params={"hiden": [8]}))
    with pytest.raises(UserError, match="params.widht"):
        check_sweep(_spec(grid={"params.widht": [1]}))
    with pytest.raises(UserError, match="unknown workload 'mpl' \\(did you mean 'mlp'\\?\\)"):
        check_sweep(validate_spec({"workload": "mpl"}))
    with pytest.raises(UserError, match="cannot import 'no_such_pkg.mod'"):
        check_sweep(validate_spec({"workload": "no_such_pkg.mod:Thing"}))


def test_ids_of_earlier_sweeps_survive_new_train_fields():
    """Sweep directories from before lr_scaling/target keep their ids (resume finds them)."""
    spec = validate_spec({"workload": "mlp", "grid": {"devices": [1, 2]}})
    plan = plan_sweep(spec, [Node(cpus=4, gpus=0, name="n")], WorkloadFacts({}))
    assert [t.trial_id for t in plan.trials] == ["ef13e2bca7", "2442a017a2"]
    target = {"metric": "val_loss", "value": 0.3, "max_steps": 400}
    for train in ({"target": target}, {"lr_scaling": "linear"}):
        changed = plan_sweep(
            validate_spec({"workload": "mlp", "grid": {"devices": [1, 2]}, "train": train}),
            [Node(cpus=4, gpus=0, name="n")],
            WorkloadFacts({}),
        )
        assert not {t.trial_id for t in changed.trials} & {t.trial_id for t in plan.trials}


#: Specs whose trial ids were recorded when trial-id schema 1 was frozen (plan.py, "trial
#: identity"), with those ids: sweep directories recorded then must resume, so they never change.
GOLDEN = [
    (
        {
            "grid": {
                "devices": [1, 2],
                "sync": ["ddp", "accumulate", "none"],
                "compile": ["eager", "inductor"],
                "params.hidden": [[64]],
            },
            "options": {"compile_cache": "warm", "accumulate_steps": 2},
            "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
        },
        ["3e3894f07a", "99814d310f", "ed7ed9fa61", "1b048f231a", "692943563e", "61692ed650"]
        + ["12cd0ce2ff", "05b94b2def", "c7aca718d1", "45a12f1832", "b1f13c6b34", "41901f7aa6"],
    ),
    (
        {
            "grid": {"batch_size": [64, 128], "sync": ["local_sgd"]},
            "train": {
                "lr_scaling": "linear",
                "lr_warmup_steps": 5,
                "target": {"metric": "val_accuracy", "value": 0.9, "max_steps": 300},
            },
        },
        ["9b95b0bb79", "10774a5ae8"],
    ),
]


@pytest.mark.parametrize(("sections", "ids"), GOLDEN, ids=["axes+options", "schedule+target"])
def test_golden_trial_ids_never_change(sections, ids):
    # No workload defaults: the ids hash the parameters, and a workload's may grow.
    plan = plan_sweep(_spec(**sections), TWO_CPUS, WorkloadFacts({}))
    assert [t.trial_id for t in plan.trials] == ids


def _one_trial(**sections):
    """A planned trial and the resolved spec its id hashes."""
    plan = plan_sweep(_spec(**sections), TWO_CPUS, WorkloadFacts({}))
    return plan.spec, plan.trials[0]


def test_a_new_axis_keeps_ids_at_its_default(monkeypatch):
    # as if `numa` were added to columns.AXIS_TABLE and columns.TrialSettings
    @dataclass(frozen=True, kw_only=True)
    class LaterSettings(TrialSettings):
        numa: str = "off"

    spec, trial = _one_trial(grid={"sync": ["ddp"]})
    at = lambda numa: LaterSettings(**trial.settings.as_dict(), numa=numa)  # noqa: E731
    # A setting with no default in the table would change every id: refused, not hashed.
    with pytest.raises(ValueError, match="'numa' is not in trial-id schema 1"):
        trial_id(spec, at("off"))
    monkeypatch.setitem(AXIS_TABLE, "numa", Axis(default="off", label="{}", snippet="-"))
    assert trial_id(spec, at("off")) == trial.trial_id
    assert trial_id(spec, at("on")) != trial.trial_id


def test_every_axis_of_the_table_is_in_the_schema_the_settings_and_the_results():
    """columns.AXIS_TABLE is the axes' one list: each is a grid field whose default list holds
    the table's default, a TrialSettings field and a results column."""
    assert AXES == tuple(AXIS_TABLE)
    assert list(TrialSettings.__dataclass_fields__)[: len(AXES)] == list(AXES)
    for name, axis in AXIS_TABLE.items():
        assert GridSpec.model_fields[name].default == [axis.default], name
        assert name in COLUMNS, name


def test_settings_hash_and_show_as_the_dict_they_were():
    """plan.json and the trial id see the settings as the dict that preceded TrialSettings:
    the axes in AXES order, then axis_params, params, options."""
    (trial,) = _plan(grid={"params.hidden": [[8]]}).trials
    settings = trial.settings.as_dict()
    assert list(settings) == [*AXES, "axis_params", "params", "options"]
    assert settings["axis_params"] == {"hidden": [8]} and settings["params"]["hidden"] == [8]


def test_the_worker_contract_reads_a_planned_trials_typed_settings():
    plan = _plan(grid={"devices": [2], "batch_size": [128]}, train={"scaling": "strong"})
    (trial,) = plan.trials
    config = TrialConfig.from_settings(trial.trial_id, trial.settings, plan.spec.train.scaling)
    assert config.settings is trial.settings  # held, not copied field by field
    s = config.settings
    assert (s.devices, s.batch_size, config.per_device_batch) == (2, 128, 64)


def test_new_resources_and_train_fields_keep_ids_at_their_default():
    class LaterResources(ResourcesSpec):
        numa_bind: bool = False

    class LaterTrain(TrainSpec):
        grad_clip: float | None = None

    class LaterTarget(TargetSpec):
        patience: int = 0

    target = {"metric": "val_loss", "value": 0.5, "max_steps": 100}
    spec, trial = _one_trial(train={"target": target})
    r, t = spec.resources.model_dump(), spec.train.model_dump()
    cases = [
        ("resources", LaterResources(**r), LaterResources(**r, numa_bind=True)),
        ("train", LaterTrain(**t), LaterTrain(**t, grad_clip=1.0)),
        (
            "train",
            spec.train.model_copy(update={"target": LaterTarget(**target)}),
            spec.train.model_copy(update={"target": LaterTarget(**target, patience=3)}),
        ),
    ]
    for section, at_default, changed in cases:
        same = spec.model_copy(update={section: at_default})
        assert trial_id(same, trial.settings) == trial.trial_id, (section, at_default)
        other = spec.model_copy(update={section: changed})
        assert trial_id(other, trial.settings) != trial.trial_id, (section, changed)
    # A field of schema 1 enters the id at its default too (it always did).
    pack = spec.model_copy(
        update={"resources": spec.resources.model_copy(update={"placement": "spread"})}
    )
    assert trial_id(pack, trial.settings) != trial.trial_id


def test_a_new_option_keeps_settings_and_ids_at_its_default(monkeypatch):
    class LaterOptions(OptionsSpec):
        static_graph: bool = False

    spec = plan_sweep(_spec(grid={"sync": ["ddp", "zero1"]}), TWO_CPUS, WorkloadFacts({})).spec
    before = {s.sync: (s, trial_id(spec, s)) for s in expand_grid(spec, {})}
    # compile_cache and zero1's bucket_cap_mb follow the same rule: absent at their default.
    zero1, zero1_id = before["zero1"]
    assert zero1.options == {}
    small = spec.model_copy(update={"options": OptionsSpec(bucket_cap_mb=1)})
    (moved,) = (s for s in expand_grid(small, {}) if s.sync == "zero1")
    assert moved.options == {"bucket_cap_mb": 1.0}
    assert trial_id(small, moved) != zero1_id
    cold = _plan(grid={"compile": ["inductor"]}, options={"compile_cache": "cold"})
    assert "compile_cache" not in cold.trials[0].settings.options
    monkeypatch.setitem(planner.OPTIONS_USED_BY, "ddp", ("bucket_cap_mb", "static_graph"))
    for value, expected in ((False, "same"), (True, "new")):
        later = spec.model_copy(update={"options": LaterOptions(static_graph=value)})
        ddp = next(s for s in expand_grid(later, {}) if s.sync == "ddp")
        if expected == "same":
            assert ddp == before["ddp"][0]
            assert trial_id(later, ddp) == before["ddp"][1]
        else:
            assert ddp.options == {"bucket_cap_mb": 25.0, "static_graph": True}
            assert trial_id(later, ddp) != before["ddp"][1]


GPU_NODE = Node(cpus=48, gpus=4, name="gpu")
GPU_SWEEP = {"grid": {"devices": [1, 4]}, "resources": {"use_gpu": True, "cpus_per_device": 4}}


def test_multi_node_plans_need_no_shared_storage():
    """No launch writes a Train checkpoint another node would read back (the driver's queue is
    the record), so Ray's state may stay on each node's disk: no node count is refused for it."""
    two_gpu_nodes = [Node(cpus=0, name="head"), GPU_NODE, Node(cpus=48, gpus=4, name="gpu2")]
    assert [t.refused for t in plan_sweep(_spec(**GPU_SWEEP), two_gpu_nodes).trials] == [None, None]
    small = _spec(grid={"devices": [1]}, resources={"cpus_per_device": 0.5})
    assert plan_sweep(small, [Node(cpus=2.0, name="a"), Node(cpus=2.0, name="b")]).runnable
    for storage in ("s3://bucket/amdahl", "/mnt/efs/amdahl"):  # still an option
        plan = plan_sweep(_spec(**GPU_SWEEP, storage=storage), two_gpu_nodes)
        assert [t.refused for t in plan.trials] == [None, None]


def test_ray_storage_keeps_one_folder_per_sweep(tmp_path):
    sweep_dir = tmp_path / "runs" / "t-20260101T000000Z"
    assert ray_storage(_spec(), sweep_dir, "train") == str(sweep_dir / "ray" / "train")
    shared = _spec(storage="s3://bucket/amdahl/")
    assert ray_storage(shared, sweep_dir) == "s3://bucket/amdahl/t-20260101T000000Z"
    assert ray_storage(_spec(storage="/mnt/efs"), sweep_dir, "train") == (
        "/mnt/efs/t-20260101T000000Z/train"
    )


# ---- resources: auto -------------------------------------------------------------------------


def test_a_sweep_without_resources_runs_1_and_2_devices_on_two_cpus():
    """The default (`resources: auto`) does the arithmetic a 2-CPU laptop needs: the 2-device
    trial, its input worker and the trial driver fit, and the plan says what it chose."""
    for resources in ({}, {"resources": "auto"}, {"resources": {"cpus_per_device": "auto"}}):
        plan = plan_sweep(
            _spec(grid={"devices": [1, 2]}, **resources), TWO_CPUS, WorkloadFacts(MLP.defaults)
        )
        assert [t.refused for t in plan.trials] == [None, None]
        chosen = plan.spec.resources
        assert (chosen.cpus_per_device, chosen.cpus_per_data_worker) == (0.79, 0.39)
        largest = plan.trials[1].resources
        assert largest.total_cpus == pytest.approx(1.98) and largest.total_cpus <= 2.0
        assert largest.data_cpus > 0 and largest.driver_cpus == DRIVER_CPUS  # both hang cases
        assert "cpus_per_device 0.79, cpus_per_data_worker 0.39" in plan.resource_note
        assert "needs 1.98 of 2 CPUs" in plan.resource_note


def test_auto_keeps_the_old_defaults_where_they_fit_and_so_the_trial_ids():
    plan = plan_sweep(_spec(grid={"devices": [1, 2]}), [Node(cpus=4)], WorkloadFacts(MLP.defaults))
    chosen = plan.spec.resources
    assert (chosen.cpus_per_device, chosen.cpus_per_data_worker) == (1.0, 0.5)
    pinned = {"cpus_per_device": 1, "cpus_per_data_worker": 0.5}
    explicit = plan_sweep(
        _spec(grid={"devices": [1, 2]}, resources=pinned),
        [Node(cpus=4)],
        WorkloadFacts(MLP.defaults),
    )
    assert [t.trial_id for t in plan.trials] == [t.trial_id for t in explicit.trials]
    assert explicit.resource_note is None


def test_explicit_values_win_and_their_refusals_stay():
    plan = _plan(grid={"devices": [1, 2]}, resources={"cpus_per_device": 0.5})
    assert plan.spec.resources.cpus_per_device == 0.5  # kept; only the data CPUs were chosen
    assert plan.spec.resources.cpus_per_data_worker == 0.5
    assert "cpus_per_data_worker 0.5" in plan.resource_note
    assert "cpus_per_device" not in plan.resource_note
    too_big = _plan(grid={"devices": [1, 2]}, resources={"cpus_per_device": 1})
    assert too_big.trials[0].refused is None
    assert "input pipeline hangs" in too_big.trials[1].refused


def test_auto_shrinks_no_further_than_a_quarter_cpu_per_device():
    """A trial that could only run on slivers of a CPU is refused; the others keep a share."""
    plan = _plan(grid={"devices": [1, 2, 4, 8]})
    runnable = [t.settings.devices for t in plan.runnable]
    assert runnable == [1, 2, 4]
    assert plan.spec.resources.cpus_per_device == 0.44
    assert "resources.cpus_per_device <=" in plan.refused[0].refused


def test_auto_counts_every_dataloader_worker_of_torch_loader_trials():
    plan = _plan(grid={"devices": [1, 2], "input": ["torch_loader"], "data_workers": [2]})
    assert all(t.refused is None for t in plan.trials)
    assert max(t.resources.total_cpus for t in plan.trials) <= 2.0


def test_auto_with_gpus_sizes_cpus_per_gpu_from_the_node_type():
    gpu = [Node(cpus=0, name="head"), Node(cpus=48, gpus=4, name="gpu-0")]
    plan = plan_sweep(
        _spec(grid={"devices": [1, 4]}, resources={"use_gpu": True}),
        gpu,
        WorkloadFacts(MLP.defaults),
    )
    # (48 CPUs - 1 for Ray) / 4 GPUs, whole CPUs: 11 each; 4 x 11 + 0.5 + 0.01 fits 48.
    assert plan.spec.resources.cpus_per_device == 11
    assert [t.refused for t in plan.trials] == [None, None]
    assert "48 CPUs less 1 for Ray, over 4 GPUs of gpu-0" in plan.resource_note
    # The smallest GPU node type decides; a user's value still wins.
    mixed = [Node(cpus=48, gpus=4, name="big"), Node(cpus=8, gpus=2, name="small")]
    spec = _spec(grid={"devices": [1]}, resources={"use_gpu": True}, storage="/mnt/efs")
    assert plan_sweep(spec, mixed, WorkloadFacts(MLP.defaults)).spec.resources.cpus_per_device == 3
    pinned = _spec(grid={"devices": [1]}, resources={"use_gpu": True, "cpus_per_device": 2})
    assert plan_sweep(pinned, gpu, WorkloadFacts(MLP.defaults)).spec.resources.cpus_per_device == 2


def test_resources_auto_is_a_valid_setting_and_other_words_are_not():
    assert _spec(resources="auto").resources.cpus_per_device is None
    with pytest.raises(UserError, match="resources: got 'manual': give auto, or a mapping"):
        _spec(resources="manual")
    with pytest.raises(UserError, match="cpus_per_device: got 'lots': give a number"):
        _spec(resources={"cpus_per_device": "lots"})


@pytest.mark.parametrize("scaling", ["weak", "strong"])
def test_plan_labels_are_what_the_report_makes_of_the_trials_rows(tmp_path, scaling):
    """The plan table, the live view and plan.json name a trial as the report and the MLflow
    runs will: the report's grouping (analysis.configs) over the rows the worker writes for
    each planned trial (protocol/identity.row_identity) gives the plan's labels."""
    plan = _plan(
        grid={
            "devices": [1, 2],
            "batch_size": [64],
            "prefetch_batches": [4, 8],
            "params.classes": [2, 3],
        },
        train={"scaling": scaling},
        resources={"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    )
    rows = []
    for launch in plan.launches():
        config = launch_config(plan.spec, launch, tmp_path, "plan")
        rows += [row_identity(config, trial, 0) for trial in config.trials]
    assert {r["trial_id"]: c.label for c in group_configs(rows) for r in c.rows} == plan.labels
    batch = "gb64" if scaling == "strong" else "b64"
    # prefetch 4 is the default: named because another trial sets 8
    assert f"d2 {batch} fp32 eager w1 ddp p4 classes=3" in plan.labels.values()


@pytest.mark.parametrize("scaling", ["weak", "strong"])
def test_a_results_row_reads_back_as_the_settings_it_was_written_from(tmp_path, scaling):
    """TrialSettings.from_row inverts protocol/identity.row_identity (the options and which
    parameters were axes are not in a row), from a dict and from a pandas row of the table."""
    plan = _plan(
        grid={"devices": [1, 2], "batch_size": [64], "prefetch_batches": [2, 8]},
        train={"scaling": scaling},
        resources={"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    )
    rows = []
    for launch in plan.launches():
        config = launch_config(plan.spec, launch, tmp_path, "plan")
        rows += [(trial.settings, row_identity(config, trial, 0)) for trial in config.trials]
    assert len(rows) == 4
    table = pa.Table.from_pylist([{k: r.get(k) for k in COLUMNS} for _, r in rows], schema=SCHEMA)
    for (settings, row), pandas_row in zip(rows, table.to_pandas().itertuples(), strict=True):
        back = replace(settings, axis_params={})
        assert TrialSettings.from_row(row, settings.options) == back
        assert TrialSettings.from_row(pandas_row._asdict(), settings.options) == back


def test_a_row_from_before_an_axis_existed_reads_as_its_default():
    row = {"devices": 2, "batch_size": 32, "precision": "bf16", "params": '{"hidden": [8]}'}
    frame = pa.Table.from_pylist([row], schema=SCHEMA).to_pandas()  # nulls: None and NaN
    for read in (row, frame.iloc[0]):
        s = TrialSettings.from_row(read)
        assert (s.devices, s.batch_size, s.precision) == (2, 32, "bf16")
        assert s.params == {"hidden": [8]} and s.axis_params == {} and s.options == {}
        rest = {a: getattr(s, a) for a in AXES if a not in ("devices", "batch_size", "precision")}
        assert rest == {a: AXIS_TABLE[a].default for a in rest}
        assert isinstance(s.prefetch_batches, int)


def test_an_eager_only_workload_has_its_compiled_trials_refused_with_its_reason():
    spec = validate_spec(
        {
            "workload": "simulated",
            "grid": {"devices": [1], "compile": ["eager", "torchscript", "inductor"]},
            "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
        }
    )
    plan = plan_sweep(spec, TWO_CPUS)
    refused = {t.settings.compile: t.refused for t in plan.trials}
    assert refused["eager"] is None
    for value in ("torchscript", "inductor"):
        assert refused[value].startswith(f"compile={value}: the simulated accelerator's layers")
        assert "sweep compile: [eager]" in refused[value]


def test_resources_auto_fits_eight_simulated_ranks_on_two_cpus():
    """The simulated device's rank mostly sleeps (Workload.host_cpus_per_device): auto gives it
    a fraction of a CPU, where a CPU rank's default would refuse 8 ranks on 2 CPUs."""
    spec = validate_spec({"workload": "simulated", "grid": {"devices": [1, 2, 4, 8]}})
    plan = plan_sweep(spec, TWO_CPUS)
    assert all(t.refused is None for t in plan.trials), [t.refused for t in plan.trials]
    assert plan.spec.resources.cpus_per_device <= 0.2
    mlp = plan_sweep(validate_spec({"workload": "mlp", "grid": {"devices": [8]}}), TWO_CPUS)
    assert mlp.trials[0].refused  # a CPU rank's default does not fit 8 on 2 CPUs


def test_accumulate_steps_crosses_every_strategy_and_keeps_the_ids_at_one():
    grid = {"devices": [2], "sync": ["ddp", "fsdp", "param_server"]}
    before = _plan(grid=grid)
    plan = _plan(grid={**grid, "accumulate_steps": [1, 4]})
    assert not plan.refused
    got = [(t.settings.sync, t.settings.accumulate_steps) for t in plan.trials]
    assert got == [(s, a) for s in grid["sync"] for a in (1, 4)]
    at_one = [t.trial_id for t in plan.trials if t.settings.accumulate_steps == 1]
    assert at_one == [t.trial_id for t in before.trials]
    assert len({t.trial_id for t in plan.trials}) == 6
    for t in plan.trials:
        config = TrialConfig.from_settings(t.trial_id, t.settings, plan.spec.train.scaling)
        assert config.micro_steps == t.settings.accumulate_steps
        assert plan.labels[t.trial_id].endswith(f"{t.settings.sync} a{config.micro_steps}")
    # plan.json names the axis only where it leaves its default, as the id hashes it
    shown = [t["settings"] for t in plan_summary(plan)["trials"]]
    assert [s.get("accumulate_steps") for s in shown] == [None, 4] * 3
    assert plan.resource_note is None or "accumulate" not in plan.resource_note


def test_sync_accumulate_still_plans_with_a_note_and_refuses_the_axis_beside_it():
    plan = _plan(
        grid={"devices": [2], "sync": ["accumulate"], "accumulate_steps": [1, 4]},
        options={"accumulate_steps": 2},
    )
    old, crossed = plan.trials
    assert old.refused is None
    config = TrialConfig.from_settings(old.trial_id, old.settings, plan.spec.train.scaling)
    assert config.micro_steps == 2
    assert crossed.refused == (
        "sync=accumulate with accumulate_steps=4: accumulate accumulates "
        "options.accumulate_steps micro-batches itself; use sync ddp with grid.accumulate_steps"
    )
    (note,) = [n for n in plan.resource_note.splitlines() if "accumulate" in n]
    assert "grid.accumulate_steps with sync ddp" in note
    # the old spelling's trial keeps the id it was recorded under
    assert (
        old.trial_id
        == _plan(grid={"devices": [2], "sync": ["accumulate"]}, options={"accumulate_steps": 2})
        .trials[0]
        .trial_id
    )
