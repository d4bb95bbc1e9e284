"""The Ray Train script at the end of report.md, run as a user would: the three names it asks
for supplied, and `trainer.fit()` on a real TorchTrainer on the session's local Ray (no patched
Ray Train call)."""

import functools
from pathlib import Path

import pytest

from amdahl import run_sweep, validate_spec
from workloads.mlp import MLP

pytestmark = pytest.mark.integration

PARAMS = {"hidden": [16], "train_rows": 512, "val_rows": 64}


def _counted_loss(marks: str, output, target):
    """The user's loss, leaving a mark per call in `marks` (the workers share this disk)."""
    import torch

    with open(marks, "a") as f:
        f.write(".")
    return torch.nn.functional.cross_entropy(output, target)


def _script(report: Path) -> str:
    text = report.read_text()
    assert "```python\n" in text, "report.md has no Ray Train script"
    return text.rsplit("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize(
    "grid",
    [{"sync": ["ddp"]}, {"sync": ["fsdp"], "accumulate_steps": [2]}],
    ids=["ddp", "fsdp-accumulate"],
)
def test_the_reports_ray_train_script_fits_under_ray_train(ray_cluster, tmp_path, grid):
    import ray.data

    spec = validate_spec(
        {
            "name": "script",
            "workload": "mlp",
            "params": PARAMS,
            "train": {"steps": 20, "warmup_steps": 2},
            "grid": {"devices": [1, 2], "batch_size": [32], **grid},
            "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
            "tracking": {"enabled": False},
        }
    )
    outcome = run_sweep(spec, runs_dir=tmp_path, tracking=False)
    script = _script(outcome.sweep_dir / "report.md")
    script = script.replace('"steps": 1000', '"steps": 30')  # the user's own choice of length

    workload = MLP(**PARAMS)
    rows = workload.generate("train", PARAMS["train_rows"], seed=0)
    items = [{"x": x, "y": y} for x, y in zip(rows["x"], rows["y"], strict=True)]
    marks = tmp_path / "marks"
    marks.touch()
    namespace = {
        "__name__": "__main__",
        "build_model": workload.build_model,
        "loss_fn": functools.partial(_counted_loss, str(marks)),
        "train_dataset": ray.data.from_items(items),
    }
    exec(compile(script, "report-script", "exec"), namespace)
    trainer = namespace["trainer"]
    devices = trainer.scaling_config.num_workers
    assert devices in (1, 2)
    micro = grid.get("accumulate_steps", [1])[0]
    # every worker ran every step's loss, once per micro-batch
    assert len(marks.read_text()) == 30 * devices * micro
