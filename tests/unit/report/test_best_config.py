"""best.yaml and the Ray Train lines (report/best.py, report/train_snippet.py).

- Every strategy x precision x compile value gives a script that compiles, whose every dotted
  name resolves in the installed torch and Ray (no misspelt hook or moved module), and that
  names the API its axis values need; its training loop runs on a real one-rank gloo group for
  every combination a CPU can run, and its TorchTrainer is built by Ray Train itself.
- best.yaml of a sweep directory written by amdahl's own writers loads with the public spec
  loader and plans, with the public planner, exactly one trial: the recommended one, same trial
  id (same workload, train section, resources). Without a recommendation none is written.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import json
import socket
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any, get_args

import pytest
from click.testing import CliRunner
from report_rows import row, write_sweep

from amdahl import Workload, load_spec, plan_sweep, validate_spec, write_reports
from amdahl.columns import AXIS_TABLE, per_device_batch
from amdahl.plan.resources import Node
from amdahl.report import train_snippet
from amdahl.report.train_snippet import RunSettings, ray_train_snippet
from amdahl.spec.schema import Compile, Precision
from amdahl.strategies import NAMES, STRATEGIES
from amdahl.sweepdir.driver_files import write_sweep_files

PRECISIONS = get_args(Precision)
COMPILES = get_args(Compile)
#: What each sync strategy's script must call (dotted names as written in the script).
SYNC_CALLS = {
    "ddp": {"DistributedDataParallel"},
    "ddp_fp16": {"DistributedDataParallel", "default_hooks.fp16_compress_hook"},
    "ddp_bf16": {"DistributedDataParallel", "default_hooks.bf16_compress_hook"},
    "powersgd": {"powerSGD_hook.PowerSGDState", "powerSGD_hook.powerSGD_hook"},
    "accumulate": {"DistributedDataParallel", "ddp.no_sync"},
    "local_sgd": {"PeriodicModelAverager", "averager.average_parameters", "dist.broadcast"},
    "zero1": {"DistributedDataParallel", "ZeroRedundancyOptimizer"},
    "fsdp": {"fully_shard", "init_device_mesh"},
    "param_server": {"make_strategy", "strategy.prepare", "strategy.step", "strategy.close"},
    "none": set(),
}
PRECISION_NAMES = {
    "fp32": set(),
    "tf32": {"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"},
    "bf16": {"torch.autocast", "torch.bfloat16"},
    "fp16": {"torch.autocast", "torch.float16", "torch.amp.GradScaler", "scaler.scale"},
    "bf16_weights": {"torch.bfloat16"},
}
COMPILE_NAMES = {"eager": set(), "inductor": {"torch.compile"}, "torchscript": {"torch.jit.script"}}
ALL_SYNC_CALLS = set().union(*SYNC_CALLS.values())


def _settings(sync: str, precision: str, compile_: str, **kw: Any) -> RunSettings:
    base = dict(
        label=f"d2 b8 {precision} {compile_} w1 {sync}",
        devices=2,
        batch_size=8,
        precision=precision,
        compile=compile_,
        sync=sync,
        options={"powersgd_rank": 3, "accumulate_steps": 3, "local_sgd_every": 2},
        cpus_per_device=0.5,
    )
    return RunSettings(**{**base, **kw})


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _names(tree: ast.AST) -> set[str]:
    """Every dotted name the script reads or calls (each prefix of a chain included)."""
    out = set()
    for node in ast.walk(tree):
        name = _dotted(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
        if name:
            out.add(name)
    return out


def _imported(tree: ast.AST) -> dict[str, Any]:
    """The script's imports, resolved in this interpreter (a bad module or name fails here)."""
    bound: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = importlib.import_module(alias.name)
                if alias.asname:
                    bound[alias.asname] = module
                else:
                    bound[alias.name.split(".")[0]] = importlib.import_module(
                        alias.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            for alias in node.names:
                bound[alias.asname or alias.name] = getattr(module, alias.name)
    return bound


def _check_resolves(tree: ast.AST) -> None:
    """Every dotted name rooted at an import is an attribute of the installed library."""
    bound = _imported(tree)
    for name in _names(tree):
        root, *rest = name.split(".")
        if root not in bound:
            continue
        obj = bound[root]
        for part in rest:
            assert hasattr(obj, part), f"{name}: {part!r} is not in {obj!r}"
            obj = getattr(obj, part)


def _keywords(tree: ast.AST, call: str) -> dict[str, Any]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _dotted(node.func) == call:
            out = {}
            for k in node.keywords:
                try:
                    out[k.arg] = ast.literal_eval(k.value)
                except ValueError:
                    out[k.arg] = ast.unparse(k.value)  # an expression: its text
            return out
    raise AssertionError(f"no call of {call}")


@pytest.mark.parametrize("sync", NAMES)
def test_every_combination_compiles_resolves_and_names_its_api(sync):
    assert set(SYNC_CALLS) == set(NAMES), "a strategy was added: say what its script calls"
    for precision, compile_ in itertools.product(PRECISIONS, COMPILES):
        for use_gpu in (False, True):
            s = _settings(sync, precision, compile_, use_gpu=use_gpu)
            text = ray_train_snippet(s)
            tree = ast.parse(text)
            compile(text, f"<{s.label}>", "exec")
            _check_resolves(tree)
            names = _names(tree)
            want = SYNC_CALLS[sync] | PRECISION_NAMES[precision] | COMPILE_NAMES[compile_]
            assert want <= names, (s.label, want - names)
            others = ALL_SYNC_CALLS - SYNC_CALLS[sync]
            if sync in ("zero1", "accumulate", "powersgd", "ddp_fp16", "ddp_bf16"):
                others -= {"DistributedDataParallel"}
            assert not (others & names), (s.label, others & names)
            # nothing another axis value needs
            assert ("torch.autocast" in names) == (precision in ("bf16", "fp16"))
            assert ("torch.amp.GradScaler" in names) == (precision == "fp16")
            assert ("torch.backends.cuda.matmul.allow_tf32" in names) == (precision == "tf32")
            assert ("torch.bfloat16" in names) == (precision in ("bf16", "bf16_weights"))
            assert ("torch.compile" in names) == (compile_ == "inductor")
            assert ("torch.jit.script" in names) == (compile_ == "torchscript")
            scaling = _keywords(tree, "ScalingConfig")
            assert scaling["num_workers"] == 2 and scaling["use_gpu"] is use_gpu
            assert scaling["resources_per_worker"] == (
                {"CPU": 0.5, "GPU": 1.0} if use_gpu else {"CPU": 0.5}
            )


#: A value other than the default for every axis (a new axis needs one here).
OTHER_VALUE = {
    "devices": 4,
    "batch_size": 16,
    "precision": "bf16",
    "compile": "inductor",
    "data_workers": 2,
    "input": "torch_loader",
    "prefetch_batches": 8,
    "sync": "fsdp",
    "accumulate_steps": 2,
    "activation_checkpointing": "full",
}


def test_the_script_reproduces_every_axis_of_the_table():
    """Each axis is a RunSettings field at its table default, the functions its table entry
    names write it, and another value of it changes the script."""
    assert set(OTHER_VALUE) == set(AXIS_TABLE), "an axis was added: give it another value here"
    defaults = {f.name: f.default for f in fields(RunSettings)}
    at_default = _settings("ddp", "fp32", "eager")
    for name, axis in AXIS_TABLE.items():
        assert name in defaults, name
        if defaults[name] is not MISSING:
            assert defaults[name] == axis.default, name
        for function in axis.snippet.split(":")[0].split(", "):
            assert callable(getattr(train_snippet, function)), (name, function)
        assert OTHER_VALUE[name] != axis.default
        changed = replace(at_default, **{name: OTHER_VALUE[name]})
        assert ray_train_snippet(changed) != ray_train_snippet(at_default), name


def test_strategy_options_reach_the_calls():
    tree = ast.parse(ray_train_snippet(_settings("powersgd", "fp32", "eager")))
    assert _keywords(tree, "powerSGD_hook.PowerSGDState")["matrix_approximation_rank"] == 3
    assert _keywords(tree, "DistributedDataParallel")["bucket_cap_mb"] == 25.0
    tree = ast.parse(ray_train_snippet(_settings("local_sgd", "fp32", "eager")))
    assert _keywords(tree, "PeriodicModelAverager")["period"] == 2
    text = ray_train_snippet(_settings("accumulate", "fp16", "eager"))
    assert "for micro in range(3):" in text and "/ 3" in text and "micro < 2" in text
    tree = ast.parse(ray_train_snippet(_settings("zero1", "fp32", "eager", optimizer="adamw")))
    assert _keywords(tree, "ZeroRedundancyOptimizer") == {
        "optimizer_class": "torch.optim.AdamW",
        "lr": 0.05,
    }
    text = ray_train_snippet(_settings("ddp", "fp32", "inductor", compile_mode="max-autotune"))
    assert "torch.compile(model, mode='max-autotune')" in text


# --------------------------------------------------------------------------- run the loop


@pytest.fixture(scope="module")
def one_rank_group():
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Shard:
    """What `ray.train.get_dataset_shard` returns, over a few in-memory batches."""

    def __init__(self, batches: list[dict[str, Any]]):
        self.batches = batches
        self.asked: dict[str, Any] = {}

    def iter_torch_batches(self, **kwargs: Any):
        self.asked = kwargs
        return iter(self.batches)


def _runnable_here() -> list[tuple[str, str, str]]:
    out = []
    for sync, precision, compile_ in itertools.product(NAMES, PRECISIONS, COMPILES):
        if sync in ("ddp_bf16", "param_server"):  # NCCL only; Ray actors (tested in worker/)
            continue
        if compile_ == "inductor" and (sync, precision) != ("accumulate", "fp32"):
            continue  # one inductor run: no_sync through the compiled wrapper (slow on CPU)
        if any((a, v) == ("compile", compile_) for a, v, _ in STRATEGIES[sync].incompatible):
            continue  # the planner refuses it
        out.append((sync, precision, compile_))
    return out


@pytest.mark.parametrize("sync,precision,compile_", _runnable_here())
def test_the_training_loop_runs_on_a_real_process_group(
    one_rank_group, monkeypatch, sync, precision, compile_
):
    """The script's own train_loop_per_worker, with Ray Train's device and dataset shard
    answered in-process: every torch call is the real one on a one-rank gloo group."""
    micro = 3 if sync == "accumulate" else 1
    _run_loop(monkeypatch, _settings(sync, precision, compile_), micro)


#: What skips the communication of all but a step's last micro-batch, per strategy.
ACCUMULATION_CALLS = {
    **dict.fromkeys(("ddp", "ddp_fp16", "powersgd", "zero1"), "ddp.no_sync"),
    "fsdp": "fsdp.set_requires_gradient_sync",
    "local_sgd": None,
    "none": None,
}


@pytest.mark.parametrize("sync", ACCUMULATION_CALLS)
def test_the_accumulate_steps_axis_runs_its_micro_batches_with_every_strategy(
    one_rank_group, monkeypatch, sync
):
    s = _settings(sync, "fp32", "eager", accumulate_steps=2)
    text = ray_train_snippet(s)
    call = ACCUMULATION_CALLS[sync]
    calls = {"ddp.no_sync", "fsdp.set_requires_gradient_sync"}
    assert _names(ast.parse(text)) & calls == ({call} if call else set())
    assert "for micro in range(2):" in text and "/ 2" in text
    _run_loop(monkeypatch, s, 2)


class _DictInputs(Workload):
    """A workload the script must run through its own methods: columns that are not x/y, a
    dict of inputs, a forward that computes the loss (counted in `losses`)."""

    defaults = {"width": 16}

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.built: list[Any] = []
        self.losses: list[float] = []

    def build_model(self) -> Any:
        import torch

        width = self.params["width"]
        self.built.append(
            torch.nn.Sequential(
                torch.nn.Linear(6, width), torch.nn.ReLU(), torch.nn.Linear(width, 3)
            )
        )
        return self.built[-1]

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, Any]:
        raise AssertionError("the loop reads the batches it is given")

    def split_batch(self, batch: dict[str, Any]) -> tuple[Any, Any]:
        return {"features": batch["features"]}, batch["label"]

    def loss(self, output: Any, target: Any) -> Any:
        raise AssertionError("forward computes the loss")

    def forward(self, model: Any, inputs: Any, targets: Any) -> tuple[Any, Any]:
        import torch

        output = model(inputs["features"])
        loss = torch.nn.functional.cross_entropy(output.float(), targets)
        self.losses.append(float(loss.detach()))
        return output, loss


def _run_loop(monkeypatch: pytest.MonkeyPatch, settings: RunSettings, micro: int) -> None:
    """Run the script's train_loop_per_worker for 4 steps through the workload it builds (the
    sweep's reference and params): `micro` losses per step, finite, and the optimizer stepped."""
    import ray.train
    import ray.train.torch
    import torch

    from amdahl.worker.training import reset_process_state

    reset_process_state()  # TorchScript's plans of earlier runs bake in their autocast dtype
    torch.manual_seed(0)
    batches = [
        {"features": torch.randn(8, 6), "label": torch.randint(0, 3, (8,))} for _ in range(40)
    ]
    shard = _Shard(batches)
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(ray.train, "get_dataset_shard", lambda name: shard)
    settings = replace(settings, workload="my_model:DictInputs", params={"width": 12})
    workload = _DictInputs(width=12)
    made: list[tuple[str, dict[str, Any]]] = []

    def make_workload(name: str, params: dict[str, Any]) -> Workload:
        made.append((name, params))
        return workload

    namespace: dict[str, Any] = {"__name__": "snippet"}
    exec(compile(ray_train_snippet(settings), "snippet", "exec"), namespace)
    namespace["make_workload"] = make_workload
    before = [p.detach().float().clone() for p in workload.build_model().parameters()]
    workload.built.clear()
    torch.manual_seed(0)
    namespace["train_loop_per_worker"]({"steps": 4})
    assert made == [("my_model:DictInputs", {"width": 12})]
    losses = workload.losses
    assert len(losses) == 4 * micro and all(map(torch.isfinite, map(torch.tensor, losses)))
    assert shard.asked == {"batch_size": 8, "prefetch_batches": 4, "drop_last": True}
    after = [
        p.full_tensor() if hasattr(p, "full_tensor") else p for p in workload.built[0].parameters()
    ]
    moved = [not torch.equal(a.detach().float(), b) for a, b in zip(after, before, strict=True)]
    assert any(moved), "the optimizer never stepped"


class _Preprocessed(_DictInputs):
    """Stored rows whose columns `preprocess` makes model-ready."""

    def preprocess(self, batch: dict[str, Any], training: bool) -> dict[str, Any]:
        assert training
        return {"features": batch["raw"].astype("float32"), "label": batch["label"]}


def test_the_torch_loader_input_runs_the_rows_through_preprocess(one_rank_group, monkeypatch):
    """Input torch_loader: the rows the launcher passes, batched in a DataLoader worker
    through the workload's preprocess, then its split_batch and forward."""
    import numpy as np
    import ray.train.torch
    import torch

    monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(ray.train.torch, "prepare_data_loader", lambda loader: loader)
    rng = np.random.default_rng(0)
    rows = [{"raw": rng.standard_normal(6), "label": i % 3} for i in range(64)]
    workload = _Preprocessed()
    settings = replace(_settings("ddp", "fp32", "eager"), input="torch_loader", data_workers=1)
    namespace: dict[str, Any] = {"__name__": "snippet"}
    exec(compile(ray_train_snippet(settings), "snippet", "exec"), namespace)
    namespace["make_workload"] = lambda name, params: workload
    namespace["train_loop_per_worker"]({"steps": 10, "rows": rows})
    assert len(workload.losses) == 10 and all(np.isfinite(workload.losses))


def test_the_launcher_builds_a_real_torch_trainer(monkeypatch):
    import ray.train.torch

    made = []
    monkeypatch.setattr(ray.train.torch.TorchTrainer, "fit", lambda self: made.append(self))
    rows = object()  # a Ray Dataset to Ray Train, which does not read it before fit()
    asked = []
    monkeypatch.setattr(
        "amdahl.data.prepare.train_rows", lambda *a, **kw: asked.append((a, kw)) or rows
    )
    s = _settings("ddp", "bf16", "eager", cpus_per_device=1.5, placement="spread")
    s = replace(s, workload="mlp", params={"hidden": [8]}, seed=7)
    namespace = {"__name__": "__main__"}
    exec(compile(ray_train_snippet(s), "snippet", "exec"), namespace)
    ((workload, name), kw) = asked[0]
    assert (type(workload).__name__, workload.params["hidden"], name, kw) == (
        "MLP",
        [8],
        "mlp",
        {"seed": 7},
    )
    (trainer,) = made
    assert trainer.scaling_config.num_workers == 2
    assert trainer.scaling_config.use_gpu is False
    assert trainer.scaling_config.resources_per_worker == {"CPU": 1.5}
    assert trainer.scaling_config.placement_strategy == "SPREAD"
    assert trainer.train_loop_config["steps"] == 1000
    assert trainer.datasets == {"train": rows}


# --------------------------------------------------------------------------- best.yaml

TWO_CPUS = [Node(cpus=2.0)]
SPEC = {
    "name": "tiny",
    "workload": "mlp",
    "params": {"hidden": [16], "train_rows": 512, "val_rows": 128},
    "train": {"steps": 8, "warmup_steps": 2, "repeats": 2},
    "grid": {
        "devices": [1, 2],
        "batch_size": [32, 64],
        "sync": ["ddp", "none", "powersgd"],
        "params.hidden": [[16], [24]],
    },
    "options": {"powersgd_rank": 2},
    "exclude": [{"sync": "powersgd", "devices": 1}],
    "tracking": {"enabled": False},
}
RUNS = (0.97, 1.0, 1.04)  # throughput of each repeat, relative to the configuration's


def _sweep_dir(tmp_path: Path, raw: dict[str, Any], winner, status: str = "ok") -> Path:
    """A sweep directory as `platform sweep` leaves it: spec.yaml, plan.json (the real
    writer, resources auto chosen for two CPUs) and rows of every runnable trial."""
    spec = validate_spec(raw)
    plan = plan_sweep(spec, TWO_CPUS)
    d = tmp_path / "runs" / "tiny-20260101T000000Z"
    d.mkdir(parents=True)
    write_sweep_files(d, spec, plan)
    rows = []
    for t in plan.runnable:
        s = t.settings
        batch = int(per_device_batch(s.batch_size, s.devices, spec.train.scaling))
        base = 1000.0 * s.devices + s.batch_size + 10 * s.params["hidden"][0]
        if winner(t):
            base *= 3
        for i, k in enumerate(RUNS):
            rows.append(
                row(
                    s.devices,
                    batch,
                    s.sync,
                    base * k,
                    repeat=i,
                    trial_id=t.trial_id,
                    params=json.dumps(s.params, sort_keys=True),
                    scaling=spec.train.scaling,
                    input=s.input,
                    prefetch_batches=s.prefetch_batches,
                    val_accuracy=0.8,
                    lr=spec.train.lr,
                    status=status,
                    error=None if status == "ok" else "failed: boom",
                )
            )
    write_sweep(d, rows)
    return d


def _is_winner(t) -> bool:
    s = t.settings
    return (s.devices, s.batch_size, s.sync, s.params["hidden"]) == (2, 64, "powersgd", [24])


def test_best_yaml_plans_exactly_the_recommended_trial(tmp_path):
    d = _sweep_dir(tmp_path, SPEC, _is_winner)
    plan = plan_sweep(validate_spec(SPEC), TWO_CPUS)
    (winner,) = [t for t in plan.runnable if _is_winner(t)]
    paths = write_reports(d)
    assert paths["best"] == d / "best.yaml"
    best = load_spec(paths["best"])
    assert best.name == "tiny-best" and best.train.repeats == 3
    assert best.search.method == "grid" and best.exclude == []
    assert best.tracking.experiment == "tiny"  # beside the sweep's own runs
    again = plan_sweep(best, TWO_CPUS)
    assert [t.trial_id for t in again.trials] == [winner.trial_id]
    assert again.trials[0].refused is None
    assert again.trials[0].settings == winner.settings
    text = paths["best"].read_text()
    assert f"platform sweep {d / 'best.yaml'}" in text
    assert f"(trial {winner.trial_id})" in text
    median = (1000.0 * 2 + 64 + 240) * 3
    assert f"{median:,.0f} ({median * 0.97:,.0f} to {median * 1.04:,.0f}, spread 7.0%, n=3)" in text
    md = paths["markdown"].read_text()
    assert f"```sh\nplatform sweep {d / 'best.yaml'}\n```" in md
    snippet = md.split("```python\n", 1)[1].split("```", 1)[0]
    compile(snippet, "report.md", "exec")
    assert "matrix_approximation_rank=2" in snippet and "num_workers=2" in snippet
    # the winner's workload and params (its params.hidden axis value among them), the seed
    namespace: dict[str, Any] = {"__name__": "report"}  # its definitions, not its launch
    exec(compile(snippet, "report.md", "exec"), namespace)
    assert namespace["WORKLOAD"] == "mlp"
    assert namespace["PARAMS"] == winner.settings.params
    assert "train_rows(workload, WORKLOAD, seed=0)" in snippet


def test_strong_scaling_pins_the_global_batch(tmp_path):
    raw = {
        **SPEC,
        "train": {**SPEC["train"], "scaling": "strong"},
        "grid": {"devices": [1, 2], "batch_size": [64], "sync": ["ddp"]},
        "exclude": [],
    }
    d = _sweep_dir(tmp_path, raw, lambda t: t.settings.devices == 2)
    best = load_spec(write_reports(d)["best"])
    assert best.grid.batch_size == [64] and best.grid.devices == [2]
    again = plan_sweep(best, TWO_CPUS)
    plan = plan_sweep(validate_spec(raw), TWO_CPUS)
    (winner,) = [t for t in plan.runnable if t.settings.devices == 2]
    assert [t.trial_id for t in again.trials] == [winner.trial_id]


def test_objective_throughput_per_device_picks_that(tmp_path):
    raw = {**SPEC, "search": {"method": "halving", "objective": "throughput_per_device"}}
    d = _sweep_dir(tmp_path, raw, lambda t: False)  # d2 is fastest, d1 b64 [24] per device
    best = load_spec(write_reports(d)["best"])
    assert (best.grid.devices, best.grid.batch_size, best.grid.sync) == ([1], [64], ["ddp"])
    assert best.grid.param_axes() == {"hidden": [[24]]}
    # Alone, `resources: auto` would give this 1-device trial more CPUs than the grid's
    # 2-device trials left it: pinned to plan.json's choice, it is the same trial.
    plan = plan_sweep(validate_spec(raw), TWO_CPUS)
    (trial,) = plan_sweep(best, TWO_CPUS).trials
    (same,) = [t for t in plan.runnable if t.settings == trial.settings]
    assert trial.trial_id == same.trial_id
    assert best.resources.cpus_per_device == plan.spec.resources.cpus_per_device
    assert "Best by throughput per device:" in (d / "best.yaml").read_text()


def test_no_recommendation_writes_no_best_yaml_and_says_why(tmp_path):
    d = _sweep_dir(tmp_path, SPEC, _is_winner, status="failed")
    (d / "best.yaml").write_text("stale: true\n")
    paths = write_reports(d)
    assert "best" not in paths and not (d / "best.yaml").exists()
    md = paths["markdown"].read_text()
    assert "No best.yaml was written: no trial ran ok" in md


def test_platform_report_prints_the_command(tmp_path, monkeypatch):
    from amdahl.cli.commands import main

    d = _sweep_dir(tmp_path, SPEC, _is_winner)
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(main, ["report", str(d)])
    assert result.exit_code == 0, result.output
    assert f"best:    platform sweep {d / 'best.yaml'}" in result.output
    failed = _sweep_dir(tmp_path / "f", SPEC, _is_winner, status="failed")
    result = CliRunner().invoke(main, ["report", str(failed)])
    assert "best:    no best.yaml: no trial ran ok" in result.output
