"""`grid.options.<name>: [...]`: an option swept as a list (spec/schema.py GridOptionsSpec,
plan/trials.py expand_grid): each value checked as `options` checks it, crossed with the axes,
a value a trial does not read dropped with one note, a trial at the defaults keeping its id,
and the configurations told apart in the rows, labels and MLflow."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from amdahl.analysis.configs import group_configs
from amdahl.cli.commands import main
from amdahl.driver.trainable import launch_config
from amdahl.errors import UserError
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import Node
from amdahl.protocol.identity import row_identity
from amdahl.spec.load import load_spec, validate_spec
from amdahl.track.child_run import _row_params, config_label_in

CPUS = [Node(cpus=4.0)]
GPUS = [Node(cpus=16.0, gpus=2.0)]


def _plan(nodes=CPUS, **sections):
    spec = validate_spec({"name": "t", "workload": "mlp", **sections})
    return plan_sweep(spec, nodes, WorkloadFacts({}))


def test_an_option_list_unread_by_a_strategy_plans_no_duplicate_and_says_so_once():
    plan = _plan(
        grid={"devices": [2], "sync": ["ddp", "fsdp"], "options": {"bucket_cap_mb": [10, 100]}}
    )
    assert [(t.settings.sync, t.settings.options) for t in plan.trials] == [
        ("ddp", {"bucket_cap_mb": 10.0}),
        ("ddp", {"bucket_cap_mb": 100.0}),
        ("fsdp", {}),
    ]
    notes = [n for n in (plan.resource_note or "").splitlines() if "grid.options" in n]
    assert notes == [
        "grid.options.bucket_cap_mb does not change sync fsdp trials (they do not read it): "
        "1 duplicate trial dropped"
    ]
    assert len({t.trial_id for t in plan.trials}) == 3


def test_a_trial_at_the_default_options_keeps_its_id():
    plain = _plan(grid={"devices": [2], "sync": ["ddp", "fsdp"]})
    swept = _plan(
        grid={
            "devices": [2],
            "sync": ["ddp", "fsdp"],
            "options": {"bucket_cap_mb": [25, 100], "fsdp_reshard_after_forward": [True, False]},
        }
    )
    before = {t.trial_id for t in plain.trials}
    assert len(before) == 2 and len({t.trial_id for t in swept.trials}) == 4
    assert before <= {t.trial_id for t in swept.trials}
    moved = [t.settings.options for t in swept.trials if t.trial_id not in before]
    assert moved == [{"bucket_cap_mb": 100.0}, {"fsdp_reshard_after_forward": False}]


def test_a_swept_value_wins_over_the_options_section_and_exclude_names_it():
    plan = _plan(
        grid={"sync": ["ddp"], "options": {"bucket_cap_mb": [10, 50, 100]}},
        options={"bucket_cap_mb": 7},
        exclude=[{"options.bucket_cap_mb": 50}],
    )
    assert [t.settings.options["bucket_cap_mb"] for t in plan.trials] == [10.0, 100.0]


@pytest.mark.parametrize(
    "grid, expected",
    [
        (
            "  options:\n    bucket_cap: [10]\n",
            ":6: grid.options.bucket_cap: unknown key 'bucket_cap' (did you mean 'bucket_cap_mb'?)",
        ),
        (
            "  options:\n    bucket_cap_mb: [10, -1]\n",
            ":6: grid.options.bucket_cap_mb[1]: must be > 0",
        ),
        (
            "  options:\n    compile_mode: [fast]\n",
            ":6: grid.options.compile_mode[0]: got 'fast'; allowed values: 'default'",
        ),
        (
            "  options:\n    fsdp_param_dtype: [fp8]\n",
            "grid.options.fsdp_param_dtype[0]: got 'fp8'",
        ),
        ("  options:\n    ps_shards: []\n", "grid.options.ps_shards: list should have at least 1"),
        ("  options:\n    ps_shards: [2, 2]\n", "grid.options.ps_shards: lists 2 twice"),
        ("  options.ps_shards: [2]\n", "option lists go under grid.options"),
    ],
)
def test_a_bad_option_list_is_refused_with_its_yaml_path(tmp_path: Path, grid: str, expected: str):
    path = tmp_path / "sweep.yaml"
    path.write_text("name: t\nworkload: mlp\ngrid:\n  sync: [ddp]\n" + grid)
    with pytest.raises(UserError) as refused:
        load_spec(path)
    assert expected in str(refused.value)
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2 and expected in result.output


def test_set_reaches_an_option_list(tmp_path: Path):
    path = tmp_path / "sweep.yaml"
    path.write_text("name: t\nworkload: mlp\n")
    spec = load_spec(path, ("grid.options.powersgd_rank=[1, 4]",))
    assert spec.grid.option_axes() == {"powersgd_rank": [1, 4]}


def test_reduce_overhead_is_refused_on_cpu_and_runs_on_gpu():
    modes = {
        "options": {"compile_mode": ["default", "reduce-overhead", "max-autotune-no-cudagraphs"]}
    }
    grid = {"compile": ["eager", "inductor"], **modes}
    cpu = {
        t.settings.options.get("compile_mode"): t.refused
        for t in _plan(grid=grid, train={"warmup_steps": 1}).trials
    }
    assert cpu[None] is None and cpu["default"] is None
    assert cpu["max-autotune-no-cudagraphs"] is None
    assert cpu["reduce-overhead"].startswith("options.compile_mode=reduce-overhead: ")
    assert "CUDA graphs" in cpu["reduce-overhead"] and "use_gpu: true" in cpu["reduce-overhead"]
    gpu = _plan(GPUS, grid=grid, resources={"use_gpu": True}, train={"warmup_steps": 1})
    assert [t.refused for t in gpu.trials] == [None] * 4  # eager once: it reads no mode


def _rows(plan, tmp_path: Path) -> list[dict]:
    """Each trial's row as the worker writes its identity (in plan order), measured ok."""
    rows = {}
    for launch in plan.launches():
        config = launch_config(plan.spec, launch, tmp_path, "plan")
        for trial in config.trials:
            rows[trial.trial_id] = {
                **row_identity(config, trial, 0),
                "status": "ok",
                "throughput": 1.0,
            }
    return [rows[t.trial_id] for t in plan.trials]


def test_configurations_differing_only_in_an_option_are_told_apart(tmp_path: Path):
    grid = {
        "devices": [2],
        "sync": ["ddp", "zero1", "fsdp"],
        "options": {"bucket_cap_mb": [25, 100]},
    }
    plan = _plan(grid=grid)
    rows = _rows(plan, tmp_path)
    assert [r["options"] for r in rows] == [
        None,
        '{"bucket_cap_mb": 100.0}',
        None,
        '{"bucket_cap_mb": 100.0}',
        None,
    ]
    by_id = {r["trial_id"]: c.label for c in group_configs(rows) for r in c.rows}
    labels = list(by_id.values())
    assert len(set(labels)) == 5
    assert "d2 b256 fp32 eager w1 ddp bucket25" in labels
    assert "d2 b256 fp32 eager w1 zero1 bucket100" in labels
    assert "d2 b256 fp32 eager w1 fsdp" in labels  # reads no bucket: names none
    assert plan.labels == by_id
    for row in rows:  # the live label is the report's
        assert config_label_in(row, plan.spec) == by_id[row["trial_id"]]
    assert _row_params(rows[1])["options.bucket_cap_mb"] == "100.0"
    assert _row_params(rows[0])["options.bucket_cap_mb"] == "25.0"  # the default, named too
    fsdp = _row_params(rows[-1])
    assert (
        "options.bucket_cap_mb" not in fsdp and fsdp["options.fsdp_reshard_after_forward"] == "True"
    )


def test_a_sweep_at_the_defaults_writes_no_options_and_labels_as_before(tmp_path: Path):
    rows = _rows(_plan(grid={"devices": [2], "sync": ["ddp", "fsdp"]}), tmp_path)
    assert [r["options"] for r in rows] == [None, None]
    assert [c.label for c in group_configs(rows)] == [
        "d2 b256 fp32 eager w1 ddp",
        "d2 b256 fp32 eager w1 fsdp",
    ]
