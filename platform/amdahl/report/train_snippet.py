"""One configuration as the lines a Ray Train (V2) script needs: `ScalingConfig`, precision
(autocast, fp16's GradScaler, TF32, bf16 weights), `torch.jit.script` or `torch.compile`, the
sync strategy's torch call (DDP and its communication hook, ZeroRedundancyOptimizer, FSDP2's
`fully_shard`, local SGD's periodic averaging), gradient accumulation (DDP's `no_sync`, FSDP2's
`set_requires_gradient_sync`) and the input, around the user's own Workload: built with the
sweep's params (`amdahl.make_workload`), trained on the rows the sweep read (`amdahl.train_rows`:
its generated copy or `params.data`, through `preprocess` where the workload has one), each
step through its `split_batch` and `forward`, its `blocks` checkpointed.

The report prints it under best.yaml (report/best.py) so that the configuration amdahl measured
can be carried into a user's own training script. Every line is what the worker side does for
that axis value (worker/training.py, worker/sync.py, worker/trial.py), written with the public
torch and Ray Train names; tests/unit/report/test_best_config.py compiles the script for every
strategy, precision and compile value and runs its training loop on a real gloo process group.
Pure text: imports neither ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amdahl.columns import AXIS_TABLE
from amdahl.strategies import OPTION_DEFAULTS, micro_steps

#: The DDP family: DistributedDataParallel with bucket_cap_mb, and what each adds.
_DDP_FAMILY = ("ddp", "ddp_fp16", "ddp_bf16", "powersgd", "accumulate", "zero1")
_AUTOCAST = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


@dataclass(frozen=True)
class RunSettings:
    """What the script must reproduce of one configuration: every axis (a field of the same
    name, at its default in columns.AXIS_TABLE) and what the spec's other sections set."""

    label: str
    devices: int
    #: samples per worker per forward/backward pass
    batch_size: int
    precision: str = AXIS_TABLE["precision"].default
    compile: str = AXIS_TABLE["compile"].default
    compile_mode: str = "default"
    sync: str = AXIS_TABLE["sync"].default
    activation_checkpointing: str = AXIS_TABLE["activation_checkpointing"].default
    #: the sync strategy's options (strategies.OPTION_DEFAULTS fills what is absent)
    options: dict[str, Any] = field(default_factory=dict)
    input: str = AXIS_TABLE["input"].default
    data_workers: int = AXIS_TABLE["data_workers"].default
    prefetch_batches: int = AXIS_TABLE["prefetch_batches"].default
    accumulate_steps: int = AXIS_TABLE["accumulate_steps"].default
    optimizer: str = "sgd"
    lr: float = 0.05
    use_gpu: bool = False
    cpus_per_device: float | None = None
    gpus_per_device: float = 1.0
    placement: str = "pack"
    #: the sweep file's `workload:` reference (`mlp`, `package.module:Class`)
    workload: str = "mlp"
    #: the workload's parameters this configuration ran with
    params: dict[str, Any] = field(default_factory=dict)
    #: train.seed: which generated rows the sweep read
    seed: int = 0

    def option(self, name: str) -> Any:
        return self.options.get(name, OPTION_DEFAULTS[name])

    @property
    def micro_steps(self) -> int:
        """Forward/backward passes per optimizer step (strategies.micro_steps)."""
        return micro_steps(self.sync, self.options, self.accumulate_steps)

    @property
    def skips_sync(self) -> str | None:
        """The module whose call skips the gradient's communication on all but a step's last
        micro-batch, kept as a name before torch.compile wraps it: `ddp` (no_sync) or `fsdp`
        (set_requires_gradient_sync); None: one pass, or no per-step communication to skip."""
        if self.micro_steps == 1:
            return None
        return "ddp" if self.sync in _DDP_FAMILY else "fsdp" if self.sync == "fsdp" else None


class _Lines:
    """Lines of Python at an indentation level."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def add(self, *lines: str) -> None:
        self.lines += [("    " * self.depth + line) if line else "" for line in lines]


def ray_train_snippet(s: RunSettings) -> str:
    """A complete script: imports, the workload, `train_loop_per_worker`, the TorchTrainer
    that runs it on the workload's rows."""
    out = _Lines()
    out.add(
        f"# {s.label} as a Ray Train (V2) script around your Workload, built with the sweep's",
        "# params; run it where the sweep found your workload's code (its folder, or PYTHONPATH).",
        *_imports(s),
        "",
        f"WORKLOAD = {s.workload!r}",
        f"PARAMS = {_literal(s.params)}",
        "",
        "",
        "def endless(make_batches):",
        '    """Batches, epoch after epoch."""',
        "    while True:",
        "        yield from make_batches()",
        "",
        "",
        *_helpers(s),
        "def train_loop_per_worker(config):",
    )
    out.depth = 1
    _setup(s, out)
    _loop(s, out)
    if s.sync == "param_server":
        out.add("strategy.close()  # ends the parameter-server actors")
    out.depth = 0
    out.add("", "")
    _launcher(s, out)
    return "\n".join(out.lines) + "\n"


def _literal(params: dict[str, Any]) -> str:
    """`params` as a Python literal, one per line where they do not fit on one."""
    one_line = repr(params)
    if len(one_line) <= 80:
        return one_line
    return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in params.items()) + "}"


def _helpers(s: RunSettings) -> list[str]:
    """Functions the loop calls: torch_loader's batch of rows through `preprocess`, and
    bf16_weights' cast of float inputs (a tensor, or each tensor of a dict)."""
    lines = []
    if s.input == "torch_loader":
        lines += [
            "def preprocessed(workload, rows):",
            '    """Stored rows as columns through your preprocess (in the loader\'s workers)."""',
            "    columns = {k: np.stack([row[k] for row in rows]) for k in rows[0]}",
            "    columns = workload.preprocess(columns, training=True)",
            "    return {k: torch.as_tensor(v) for k, v in columns.items()}",
            "",
            "",
        ]
    if s.precision == "bf16_weights":
        lines += [
            "def bf16(inputs):",
            '    """bf16_weights: float inputs in the weights\' dtype (each tensor of a dict)."""',
            "    if isinstance(inputs, dict):",
            "        return {k: bf16(v) for k, v in inputs.items()}",
            "    return inputs.to(torch.bfloat16) if inputs.is_floating_point() else inputs",
            "",
            "",
        ]
    return lines


#: The imports each sync strategy's lines need, beyond torch's.
_SYNC_IMPORTS: dict[str, tuple[str, ...]] = {
    **{
        n: ("from torch.nn.parallel import DistributedDataParallel",)
        for n in ("ddp", "powersgd", "accumulate", "zero1")
    },
    **{
        n: (
            "from torch.nn.parallel import DistributedDataParallel",
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks",
        )
        for n in ("ddp_fp16", "ddp_bf16")
    },
    "fsdp": (
        "import torch.distributed as dist",
        "from torch.distributed.device_mesh import init_device_mesh",
    ),
    "local_sgd": (
        "import torch.distributed as dist",
        "from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager",
    ),
}
_SYNC_IMPORTS["powersgd"] += (
    "from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook",
)
_SYNC_IMPORTS["zero1"] += ("from torch.distributed.optim import ZeroRedundancyOptimizer",)
_CHECKPOINT_IMPORT = (
    "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (\n"
    "    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper,\n)"
)


def _imports(s: RunSettings) -> list[str]:
    checkpointing = s.activation_checkpointing != "none"
    standard = [
        *(["import contextlib"] if s.skips_sync == "ddp" else []),
        *(["import functools"] if checkpointing or s.input == "torch_loader" else []),
    ]
    lines = [*standard, *([""] if standard else [])]
    lines += ["import numpy as np"] if s.input == "torch_loader" else []
    lines.append("import torch")
    lines += _SYNC_IMPORTS.get(s.sync, ())
    if s.sync == "fsdp":
        policy = "MixedPrecisionPolicy, " if _fsdp_policy(s) is not None else ""
        lines.append(f"from torch.distributed.fsdp import {policy}fully_shard")
    lines += [_CHECKPOINT_IMPORT] if checkpointing else []
    lines += ["", "import ray.train", "import ray.train.torch"]
    lines += ["from ray.train import ScalingConfig", "from ray.train.torch import TorchTrainer"]
    if s.sync == "param_server":  # amdahl's parameter server
        return [*lines, "", "from amdahl import make_strategy, make_workload, train_rows"]
    return [*lines, "", "from amdahl import make_workload, train_rows"]


def _optimizer(s: RunSettings, params: str) -> str:
    if s.optimizer == "adamw":
        return f"torch.optim.AdamW({params}, lr={s.lr!r})"
    return f"torch.optim.SGD({params}, lr={s.lr!r}, momentum=0.9)"


def _setup(s: RunSettings, out: _Lines) -> None:
    """Device, precision, compilation and the sync strategy, in the harness's order
    (worker/trial.py's build: weights cast, script, strategy, then torch.compile around it)."""
    out.add("workload = make_workload(WORKLOAD, PARAMS)", "device = ray.train.torch.get_device()")
    if s.precision == "tf32":
        out.add(
            "torch.backends.cuda.matmul.allow_tf32 = True  # tf32: float32 matmuls on tensor cores",
            "torch.backends.cudnn.allow_tf32 = True",
        )
    out.add("model = workload.build_model().to(device)")
    if s.precision == "bf16_weights":
        out.add("model = model.to(torch.bfloat16)  # bf16_weights: weights and float inputs")
    _checkpointing(s, out)
    if s.compile == "torchscript":
        out.add(
            "# before any wrapper (DDP cannot be scripted); torch deprecates TorchScript in",
            "# favour of torch.compile",
            "model = torch.jit.script(model)",
        )
    _sync_setup(s, out)
    if s.compile == "inductor":
        mode = "" if s.compile_mode == "default" else f", mode={s.compile_mode!r}"
        out.add(f"model = torch.compile(model{mode})  # around the wrapper: sees DDP's buckets")
    if s.precision == "fp16":
        out.add("scaler = torch.amp.GradScaler(device.type)  # fp16 gradients underflow unscaled")
    _input(s, out)


def _checkpointing(s: RunSettings, out: _Lines) -> None:
    """The blocks checkpointed as worker/checkpointing.py does: every one (full) or every
    other one from the first (selective), with torch's non-reentrant checkpoint."""
    if s.activation_checkpointing == "none":
        return
    every = "" if s.activation_checkpointing == "full" else "[::2]"
    out.add(
        f"# activation checkpointing {s.activation_checkpointing}: these blocks keep only their",
        "# inputs and run their forward again in the backward",
        f"checkpointed = {{id(b) for b in workload.blocks(model){every}}}",
        "apply_activation_checkpointing(",
        "    model,",
        "    checkpoint_wrapper_fn=functools.partial(",
        "        checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT",
        "    ),",
        "    check_fn=lambda m: id(m) in checkpointed,",
        ")",
    )


def _fsdp_policy(s: RunSettings) -> str | None:
    """The MixedPrecisionPolicy arguments of fsdp's dtype options, or None where both are
    null (FSDP2's default policy)."""
    dtypes = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}
    given = [
        f"{field}={dtypes[s.option(f'fsdp_{field}')]}"
        for field in ("param_dtype", "reduce_dtype")
        if s.option(f"fsdp_{field}") is not None
    ]
    return ", ".join(given) if given else None


def _fsdp_setup(s: RunSettings, out: _Lines) -> None:
    """FSDP2's `fully_shard` on each shard unit (worker.sync.shard_units: a child with
    parameters, a container's children in its place), then the root, with the trial's fsdp
    options where they are not FSDP2's defaults (worker/sync.py, FSDPSync)."""
    out.add("mesh = init_device_mesh(device.type, (dist.get_world_size(),))")
    settings = ""
    if not s.option("fsdp_reshard_after_forward"):
        settings += ", reshard_after_forward=False"
    policy = _fsdp_policy(s)
    if policy is not None:
        out.add(f"mp_policy = MixedPrecisionPolicy({policy})")
        settings += ", mp_policy=mp_policy"
    out.add(
        "",
        "def shard_units(module):",
        '    """Each child with parameters; a ModuleList\'s or ModuleDict\'s children in its',
        '    place (fully_shard refuses containers without a forward)."""',
        "    for child in module.children():",
        "        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):",
        "            yield from shard_units(child)",
        "        elif any(True for _ in child.parameters()):",
        "            yield child",
        "",
        "for unit in list(shard_units(model)):  # FSDP2: each unit, then the root",
        f"    fully_shard(unit, mesh=mesh{settings})",
        f"fully_shard(model, mesh=mesh{settings})",
    )


def _sync_setup(s: RunSettings, out: _Lines) -> None:
    """`model` wrapped and `optimizer` made as sync strategy `s.sync` does it (worker/sync.py)."""
    if s.sync in _DDP_FAMILY:
        out.add(
            "model = DistributedDataParallel(",
            '    model, device_ids=[device.index] if device.type == "cuda" else None,',
            f"    bucket_cap_mb={float(s.option('bucket_cap_mb'))!r},",
            ")",
        )
    if s.sync == "ddp_fp16":
        out.add("model.register_comm_hook(None, default_hooks.fp16_compress_hook)")
    elif s.sync == "ddp_bf16":
        out.add("model.register_comm_hook(None, default_hooks.bf16_compress_hook)  # NCCL only")
    elif s.sync == "powersgd":
        out.add(
            "state = powerSGD_hook.PowerSGDState(",
            f"    process_group=None, matrix_approximation_rank={int(s.option('powersgd_rank'))},",
            "    start_powerSGD_iter=1000,  # torch's default: 1000 plain all-reduce steps first",
            ")",
            "model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)",
        )
    elif s.sync == "fsdp":
        _fsdp_setup(s, out)
    elif s.sync == "local_sgd":
        out.add(
            "for tensor in model.state_dict().values():  # every replica starts from rank 0's",
            "    dist.broadcast(tensor, src=0)",
            "# parameters averaged every `period` steps (amdahl also averages float buffers)",
            f"averager = PeriodicModelAverager(period={int(s.option('local_sgd_every'))}, "
            "warmup_steps=0)",
        )
    elif s.sync == "none":
        out.add(
            "# sync none: each worker trains its own model (no gradient communication)"
            if s.devices > 1
            else "# one worker: no gradient communication"
        )
    if s.skips_sync == "ddp":
        out.add("ddp = model  # its no_sync() skips the all-reduce of all but the last micro-batch")
    elif s.skips_sync == "fsdp":
        out.add(
            "fsdp = model  # set_requires_gradient_sync(False): no reduce-scatter of all but the",
            "# last micro-batch (FSDP2 keeps the unsharded gradients until then)",
        )
    _optimizer_setup(s, out)


def _optimizer_setup(s: RunSettings, out: _Lines) -> None:
    """`optimizer` made as sync strategy `s.sync` needs it: sharded (ZeRO-1), through the
    parameter server's strategy, or the plain optimizer."""
    if s.sync == "zero1":
        optimizer_class = "torch.optim.AdamW" if s.optimizer == "adamw" else "torch.optim.SGD"
        kwargs = f"lr={s.lr!r}" + (", momentum=0.9" if s.optimizer != "adamw" else "")
        out.add(
            "optimizer = ZeroRedundancyOptimizer(  # ZeRO-1: optimizer state sharded over ranks",
            f"    model.parameters(), optimizer_class={optimizer_class}, {kwargs}",
            ")",
        )
    elif s.sync == "param_server":
        out.add(
            "# parameter shards on Ray actors: gradients pushed, parameters pulled each step",
            'strategy = make_strategy("param_server", '
            f'{{"ps_shards": {int(s.option("ps_shards"))}}}, device)',
            "model, optimizer = strategy.prepare(",
            f"    model, lambda params: {_optimizer(s, 'params')}",
            ")",
        )
    else:
        out.add(f"optimizer = {_optimizer(s, 'model.parameters()')}")


def _input(s: RunSettings, out: _Lines) -> None:
    if s.input == "torch_loader":
        out.add(
            "loader = ray.train.torch.prepare_data_loader(  # a DistributedSampler per worker",
            "    torch.utils.data.DataLoader(",
            f'        config["rows"], batch_size={s.batch_size}, shuffle=True, drop_last=True,',
            f"        num_workers={s.data_workers}, "
            "collate_fn=functools.partial(preprocessed, workload),",
            "    )",
            ")",
            "batches = endless(lambda: loader)",
        )
        return
    out.add(
        'shard = ray.train.get_dataset_shard("train")',
        "batches = endless(",
        "    lambda: shard.iter_torch_batches(",
        f"        batch_size={s.batch_size}, prefetch_batches={s.prefetch_batches}, drop_last=True",
        "    )",
        ")",
    )


def _loop(s: RunSettings, out: _Lines) -> None:
    """The step: micro-batches (accumulating: each backward adds its share of the step's loss,
    communicated on the last only: `skips_sync`), autocast around forward and loss, backward
    through the scaler, the strategy's step, local SGD's average."""
    micro = s.micro_steps
    out.add('for step in range(config["steps"]):')
    out.depth += 1
    if micro > 1:
        out.add(f"for micro in range({micro}):")
        out.depth += 1
    out.add(
        "batch = {k: v.to(device) for k, v in next(batches).items()}",
        "inputs, targets = workload.split_batch(batch)",
    )
    if s.precision == "bf16_weights":
        out.add("inputs = bf16(inputs)")
    if s.skips_sync == "fsdp":
        out.add(f"fsdp.set_requires_gradient_sync(micro == {micro - 1})")
    if s.skips_sync == "ddp":
        out.add(f"with ddp.no_sync() if micro < {micro - 1} else contextlib.nullcontext():")
        out.depth += 1
    forward = "output, loss = workload.forward(model, inputs, targets)  # (output, mean loss)"
    if s.precision in _AUTOCAST:
        out.add(f"with torch.autocast(device.type, dtype={_AUTOCAST[s.precision]}):")
        out.add(f"    {forward}")
    else:
        out.add(forward)
    if micro > 1:
        out.add(f"loss = loss / {micro}  # this micro-batch's share of the step's loss")
    out.add("scaler.scale(loss).backward()" if s.precision == "fp16" else "loss.backward()")
    out.depth -= (micro > 1) + (s.skips_sync == "ddp")
    if s.sync == "param_server":
        out.add("strategy.step(optimizer, " + ("scaler)" if s.precision == "fp16" else "None)"))
    elif s.precision == "fp16":
        out.add("scaler.step(optimizer)", "scaler.update()")
    else:
        out.add("optimizer.step()")
    if s.sync == "local_sgd":  # before zero_grad: it averages the parameters that have grads
        out.add("averager.average_parameters(model.parameters())")
    out.add("optimizer.zero_grad(set_to_none=True)")
    out.depth -= 1


def _launcher(s: RunSettings, out: _Lines) -> None:
    """The workload's rows (through its preprocess as the sweep's input ran it) and
    `ScalingConfig` with the workers, their resources and placement amdahl measured."""
    per_worker = []
    if s.cpus_per_device is not None:
        per_worker.append(f'"CPU": {s.cpus_per_device!r}')
    if s.use_gpu:
        per_worker.append(f'"GPU": {s.gpus_per_device!r}')
    out.add(
        'if __name__ == "__main__":',
        "    workload = make_workload(WORKLOAD, PARAMS)",
        "    # the rows the sweep read: its generated copy (amdahl's data cache) or params.data",
        f"    train = train_rows(workload, WORKLOAD, seed={s.seed})",
    )
    if s.input == "torch_loader":
        config = '{"steps": 1000, "rows": train.take_all()}'
        datasets = []
    else:
        config = '{"steps": 1000}'
        datasets = ['        datasets={"train": train},']
        out.add(
            "    if workload.preprocesses:  # in Ray Data tasks, as the sweep's input pipeline",
            "        train = train.map_batches(",
            '            workload.preprocess, fn_kwargs={"training": True}, batch_format="numpy",',
            f"            concurrency={s.data_workers},",
            "        )",
        )
    out.add(
        "    trainer = TorchTrainer(",
        "        train_loop_per_worker,",
        f"        train_loop_config={config},",
        "        scaling_config=ScalingConfig(",
        f"            num_workers={s.devices},",
        f"            use_gpu={s.use_gpu},",
        *([f"            resources_per_worker={{{', '.join(per_worker)}}},"] if per_worker else []),
        f'            placement_strategy="{s.placement.upper()}",',
        "        ),",
        *datasets,
        "    )",
        "    trainer.fit()",
    )
