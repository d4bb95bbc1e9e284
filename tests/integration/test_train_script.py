"""The Ray Train script at the end of report.md, run as a user would: as written (the user's
own number of steps aside), `trainer.fit()` on a real TorchTrainer on the session's local Ray
(no patched Ray Train call), building the sweep's workload and reading the rows it read."""

import pytest

from amdahl import run_sweep, validate_spec

pytestmark = pytest.mark.integration

MLP = {"workload": "script_workloads:CountedMLP", "params": {"hidden": [16]}}
#: Columns that are not x/y, preprocessing, a model that takes its targets and returns
#: (logits, loss), and blocks to checkpoint.
TOKENS = {"workload": "script_workloads:NextToken", "params": {}}


def _script(report) -> str:
    text = report.read_text()
    assert "```python\n" in text, "report.md has no Ray Train script"
    return text.rsplit("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize(
    "workload,grid",
    [
        (MLP, {"sync": ["ddp"]}),
        # one sweep for the rest (each costs a minute): a model that takes its targets, its
        # columns not x/y, FSDP2 with accumulation and checkpointing
        (
            TOKENS,
            {"sync": ["fsdp"], "accumulate_steps": [2], "activation_checkpointing": ["full"]},
        ),
    ],
    ids=["ddp", "targets-taking-model-fsdp-accumulate-checkpointed"],
)
def test_the_reports_ray_train_script_fits_under_ray_train(ray_cluster, tmp_path, workload, grid):
    params = {**workload["params"], "train_rows": 512, "val_rows": 64}
    spec = validate_spec(
        {
            "name": "script",
            "workload": workload["workload"],
            "params": params,
            "train": {"steps": 20, "warmup_steps": 2},
            "grid": {"devices": [1, 2], "batch_size": [32], **grid},
            "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
            "tracking": {"enabled": False},
        }
    )
    outcome = run_sweep(spec, runs_dir=tmp_path, tracking=False)
    script = _script(outcome.sweep_dir / "report.md")
    assert f"WORKLOAD = {workload['workload']!r}" in script
    marks = tmp_path / "marks"
    marks.touch()
    script = script.replace('"steps": 1000', '"steps": 30')  # the user's own choice of length
    script = script.replace("'marks': ''", f"'marks': {str(marks)!r}")

    namespace = {"__name__": "__main__"}
    exec(compile(script, "report-script", "exec"), namespace)
    devices = namespace["trainer"].scaling_config.num_workers
    assert devices in (1, 2)
    micro = grid.get("accumulate_steps", [1])[0]
    # every worker ran every step's forward through the workload, once per micro-batch
    assert len(marks.read_text()) == 30 * devices * micro
