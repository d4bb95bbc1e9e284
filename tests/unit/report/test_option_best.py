"""Swept options in best.yaml and the Ray Train script (report/best.py, report/train_snippet.py):
best.yaml pins a `grid.options` list to the recommended configuration's value (same trial id),
and fsdp's options reach the script's `fully_shard` calls, which run on a real gloo group."""

from __future__ import annotations

import ast
import socket
from pathlib import Path
from typing import Any

import pytest
from report_rows import row, write_sweep

from amdahl import Workload, load_spec, plan_sweep, validate_spec, write_reports
from amdahl.plan.resources import Node
from amdahl.report.train_snippet import RunSettings, ray_train_snippet
from amdahl.sweepdir.driver_files import write_sweep_files

TWO_CPUS = [Node(cpus=2.0)]
SPEC = {
    "name": "tiny",
    "workload": "mlp",
    "params": {"hidden": [16], "train_rows": 512, "val_rows": 128},
    "train": {"steps": 8, "warmup_steps": 2, "repeats": 2},
    "grid": {
        "devices": [2],
        "batch_size": [32],
        "sync": ["ddp", "fsdp"],
        "options": {"bucket_cap_mb": [25, 100], "fsdp_reshard_after_forward": [True, False]},
    },
    "tracking": {"enabled": False},
}


def _sweep_dir(tmp_path: Path, winner) -> Path:
    """spec.yaml and plan.json by amdahl's writers, and rows of every trial with their real
    identity; `winner(trial)` runs three times as fast as the rest."""
    from amdahl.driver.trainable import launch_config
    from amdahl.protocol.identity import row_identity

    spec = validate_spec(SPEC)
    plan = plan_sweep(spec, TWO_CPUS)
    d = tmp_path / "runs" / "tiny-20260101T000000Z"
    d.mkdir(parents=True)
    write_sweep_files(d, spec, plan)
    rows = []
    for launch in plan.launches():
        config = launch_config(plan.spec, launch, d, "s")
        for t in config.trials:
            ident = row_identity(config, t, 0)
            speed = 3000.0 if winner(t.settings) else 1000.0
            for i, k in enumerate((0.97, 1.0, 1.04)):
                rows.append(
                    row(
                        2,
                        32,
                        t.settings.sync,
                        speed * k,
                        repeat=i,
                        trial_id=t.trial_id,
                        params=ident["params"],
                        options=ident["options"],
                        lr=spec.train.lr,
                    )
                )
    write_sweep(d, rows)
    return d


@pytest.mark.parametrize(
    "winner, options",
    [
        (lambda s: s.sync == "ddp" and s.options["bucket_cap_mb"] == 100, {"bucket_cap_mb": 100}),
        (lambda s: s.sync == "ddp" and s.options["bucket_cap_mb"] == 25, {"bucket_cap_mb": 25}),
        (lambda s: s.sync == "fsdp" and bool(s.options), {"fsdp_reshard_after_forward": False}),
    ],
)
def test_best_yaml_pins_a_swept_option_to_the_winners_value(tmp_path, winner, options):
    d = _sweep_dir(tmp_path, winner)
    plan = plan_sweep(validate_spec(SPEC), TWO_CPUS)
    (won,) = [t for t in plan.trials if winner(t.settings)]
    paths = write_reports(d)
    best = load_spec(paths["best"])
    assert best.grid.option_axes() == {}
    assert {k: getattr(best.options, k) for k in options} == options
    (again,) = plan_sweep(best, TWO_CPUS).trials
    assert again.trial_id == won.trial_id
    md = paths["markdown"].read_text()
    snippet = md.split("```python\n", 1)[1].split("```", 1)[0]
    if "bucket_cap_mb" in options:
        assert f"bucket_cap_mb={float(options['bucket_cap_mb'])!r}" in snippet
    else:
        assert "fully_shard(model, mesh=mesh, reshard_after_forward=False)" in snippet


def _fsdp(**options: Any) -> RunSettings:
    return RunSettings(
        label="d1 b8 fp32 eager w1 fsdp", devices=1, batch_size=8, sync="fsdp", options=options
    )


def _keywords(script: str, call: str) -> list[dict[str, str]]:
    return [
        {k.arg: ast.unparse(k.value) for k in node.keywords}
        for node in ast.walk(ast.parse(script))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == call
    ]


def test_fsdp_options_reach_the_scripts_fully_shard():
    plain = ray_train_snippet(_fsdp())
    assert "MixedPrecisionPolicy" not in plain and "reshard_after_forward" not in plain
    assert _keywords(plain, "fully_shard") == [{"mesh": "mesh"}] * 2
    script = ray_train_snippet(
        _fsdp(fsdp_reshard_after_forward=False, fsdp_param_dtype="bf16", fsdp_reduce_dtype="fp32")
    )
    every = {"mesh": "mesh", "reshard_after_forward": "False", "mp_policy": "mp_policy"}
    assert _keywords(script, "fully_shard") == [every] * 2
    assert _keywords(script, "MixedPrecisionPolicy") == [
        {"param_dtype": "torch.bfloat16", "reduce_dtype": "torch.float32"}
    ]
    assert "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard" in script


def test_the_fsdp_script_with_its_options_trains_on_a_real_process_group(monkeypatch):
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        batches = [{"x": torch.randn(8, 6), "y": torch.randint(0, 3, (8,))} for _ in range(8)]

        class Shard:
            def iter_torch_batches(self, **kwargs: Any):
                return iter(batches)

        monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cpu"))
        monkeypatch.setattr(ray.train, "get_dataset_shard", lambda name: Shard())
        dtypes: list[torch.dtype] = []

        class Classifier(Workload):
            """The user's workload, as the script builds it (make_workload)."""

            def build_model(self) -> torch.nn.Module:
                return torch.nn.Sequential(
                    torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
                )

            def generate(self, split: str, num_rows: int, seed: int) -> dict[str, Any]:
                raise AssertionError("the loop reads the batches it is given")

            def split_batch(self, batch: dict[str, Any]) -> tuple[Any, Any]:
                return batch["x"], batch["y"]

            def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
                dtypes.append(output.dtype)
                return torch.nn.functional.cross_entropy(output.float(), target)

        settings = _fsdp(fsdp_reshard_after_forward=False, fsdp_param_dtype="bf16")
        namespace: dict[str, Any] = {"__name__": "snippet"}
        exec(compile(ray_train_snippet(settings), "snippet", "exec"), namespace)
        namespace["make_workload"] = lambda name, params: Classifier(**params)
        namespace["train_loop_per_worker"]({"steps": 3})
    finally:
        dist.destroy_process_group()
    assert dtypes == [torch.bfloat16] * 3  # the policy's compute dtype
