"""The Workload API: what a user subclasses to put their own model under the platform.

A workload states its model, its data (synthetic rows the platform stores once as parquet, or the
user's own parquet through `params.data`), its loss, and optionally its preprocessing (run in the
input pipeline), its accuracy and FLOPs per sample. It never touches Ray, MLflow or timing:
the harness owns those, so every workload is measured the same way.

A workload is a `Workload` subclass named as `package.module:Class` in the sweep file: finding,
importing and shipping its code is workload/code.py's; running its data path on a few rows at
plan time is workload/data_checks.py's.

This module imports no torch at module level so the CLI and planner stay fast.
"""

from __future__ import annotations

import abc
import difflib
from typing import TYPE_CHECKING, Any, ClassVar

from amdahl.errors import UserError

if TYPE_CHECKING:
    import numpy as np
    import torch

#: What a subclass must implement; one missing is refused at plan time (abstract methods).
REQUIRED = ("build_model", "generate", "split_batch", "loss")


class Workload(abc.ABC):
    """Base class. Subclass it, set `defaults`, and implement the four abstract methods.

    `params` from the sweep file (and `params.<name>` grid axes) arrive as keyword arguments;
    keys absent from `defaults` are rejected before anything launches.
    """

    #: Every parameter the workload accepts, with its default value. Every workload also
    #: accepts `data`: a directory (local path or a URI Ray Data and pyarrow read, such as
    #: s3://bucket/dir) holding `train/` and `val/` parquet to use instead of generated rows.
    defaults: ClassVar[dict[str, Any]] = {}

    #: The parameters that decide the stored rows (None: all of them). Sweeping any other
    #: parameter (a width, an augmentation) reuses the same stored and materialised data.
    data_params: ClassVar[tuple[str, ...] | None] = None

    #: The parameters `preprocess` reads (None: all of them). Trials that differ only in other
    #: parameters (a model width) share a launch and its running input pipeline; undeclared,
    #: every parameter change starts a new one (safe, slower).
    preprocess_params: ClassVar[tuple[str, ...] | None] = None

    #: MFU's FLOPs per sample are counted (torch's FlopCounterMode over one training step of
    #: the model, worker/flops.py); `flops_per_sample` is a cross-check the report compares
    #: with the count. True: MFU uses `flops_per_sample` instead, for work the counter cannot
    #: see (custom kernels, ops without a FlopCounterMode formula).
    flops_override: ClassVar[bool] = False

    #: Why this workload runs eager only (its work is not something TorchScript or
    #: torch.compile can take, such as a simulated device's sleeps); None: every compile
    #: value. The planner refuses the others with this reason.
    eager_only: ClassVar[str | None] = None

    #: CPUs one rank needs of its host when the planner chooses them (`resources: auto`);
    #: None: the planner's default for a CPU rank. A simulated device, whose rank mostly
    #: sleeps, needs a fraction.
    host_cpus_per_device: ClassVar[float | None] = None

    def __init__(self, **params: Any):
        unknown = sorted(set(params) - set(self.defaults) - {"data"})
        if unknown:
            close = difflib.get_close_matches(unknown[0], list(self.defaults), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserError(
                f"params.{unknown[0]}: {type(self).__name__} has no parameter {unknown[0]!r}"
                f"{hint}; it accepts: {', '.join(sorted(self.defaults)) or 'none'}"
            )
        self.params = {**self.defaults, **params}

    # ---- to implement -------------------------------------------------------------------

    @abc.abstractmethod
    def build_model(self) -> torch.nn.Module:
        """A freshly initialised model (the harness seeds torch before calling this)."""
        raise NotImplementedError

    @abc.abstractmethod
    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        """Synthetic rows for `split` ("train" or "val") as equal-length numpy columns."""
        raise NotImplementedError

    @abc.abstractmethod
    def split_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) from one batch of columns."""
        raise NotImplementedError

    @abc.abstractmethod
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean loss over the batch."""
        raise NotImplementedError

    # ---- optional -----------------------------------------------------------------------

    def forward(self, model: torch.nn.Module, inputs: Any, targets: Any) -> tuple[Any, Any]:
        """One forward with its loss: (output, mean loss over the batch). The default calls
        `model(inputs)` and `self.loss(output, targets)`. Override it for a model that takes
        its targets or computes its own loss (nanoGPT's `forward(idx, targets)` returns
        `(logits, loss)`; Hugging Face models take `labels=`), or whose inputs are a dict
        (`model(**inputs)`). The timed loop, validation, the FLOP count and the memory probe
        all call it, inside the trial's autocast."""
        output = model(inputs)
        return output, self.loss(output, targets)

    def blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The modules `grid.activation_checkpointing` wraps, in forward order (a transformer's
        layers, a ResNet's residual blocks): each keeps only its input through the forward and
        recomputes the rest in the backward. The default names none, and a sweep asking for
        full or selective checkpointing of such a workload is refused at plan time."""
        return []

    def names_blocks(self) -> bool:
        """Whether this workload overrides `blocks` (the plan's check; not to override)."""
        return type(self).blocks is not Workload.blocks

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """Number of correct predictions (for val_accuracy): argmax over the last dimension
        equal to the target. Return None where accuracy has no meaning (regression)."""
        return (output.argmax(dim=-1) == target).sum()

    def flops_per_sample(self) -> float | None:
        """Training FLOPs per sample (forward + backward) as you state them: compared with the
        counted figure (the report names both where they differ by more than 10%), and used
        for achieved FLOP/s and MFU only with `flops_override` or where counting failed."""
        return None

    def peak_flops(self, precision: str) -> float | None:
        """The peak FLOP/s MFU is read against, where the workload states its device (a
        simulated one); None (the default): the device's measured peak (worker/peak.py)."""
        return None

    def device_memory_gb(self) -> float | None:
        """The memory in GB of the device the workload states it runs on (a simulated one),
        which the plan's memory check uses where `resources.device_memory_gb` is not given;
        None (the default): only that field says."""
        return None

    def rows(self, split: str) -> int:
        """How many rows of `split` to store; the harness cycles through them."""
        return int(self.params.get(f"{split}_rows", 8192 if split == "train" else 2048))

    def preprocess(self, batch: dict[str, np.ndarray], training: bool) -> dict[str, np.ndarray]:
        """Stored rows -> model-ready columns (decode, normalise, augment when `training`).

        Runs in the input pipeline (Ray Data map tasks or torch DataLoader workers, with
        `data_workers` of them), never in the training step; the default passes rows through.
        Under both inputs `batch` holds the columns as stored: a column of two or more
        dimensions as a (rows, width) array (its rows flattened), bytes as an object array.
        """
        return batch

    # ---- provided -----------------------------------------------------------------------

    def source(self, split: str) -> str | None:
        """Where the user's parquet for `split` lives (`params.data`/<split>), or None."""
        data = self.params.get("data")
        return f"{str(data).rstrip('/')}/{split}" if data else None

    def data_key(self) -> dict[str, Any]:
        """The parameters that decide the stored rows (see `data_params`)."""
        if self.data_params is None:
            return dict(self.params)
        names = (*self.data_params, "data")
        return {k: self.params[k] for k in names if k in self.params}

    def input_key(self) -> dict[str, Any]:
        """The parameters that decide a rank's input batches: the stored rows (`data_key`) and
        what preprocessing reads (`preprocess_params`). Trials with equal keys can share one
        input pipeline."""
        key = {"data": self.data_key()}
        if self.preprocesses:
            names = self.params if self.preprocess_params is None else self.preprocess_params
            key["preprocess"] = {k: self.params[k] for k in names if k in self.params}
        return key

    @property
    def preprocesses(self) -> bool:
        """Whether this workload overrides `preprocess` (else the pipeline skips that stage)."""
        return type(self).preprocess is not Workload.preprocess
