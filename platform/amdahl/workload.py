"""The Workload API: what a user subclasses to put their own model under the platform.

A workload states its model, its data (synthetic rows the platform stores once as parquet, or the
user's own parquet through `params.data`), its loss, and optionally its preprocessing (run in the
input pipeline), its accuracy and FLOPs per sample. It never touches Ray, MLflow or timing:
the harness owns those, so every workload is measured the same way.

This module imports no torch at module level so the CLI and planner stay fast.
"""

from __future__ import annotations

import difflib
import importlib
from typing import TYPE_CHECKING, Any, ClassVar

from amdahl.errors import UserError

if TYPE_CHECKING:
    import numpy as np
    import torch

#: Short names usable as `workload:` in a sweep file.
REGISTERED: dict[str, str] = {
    "mlp": "workloads.mlp:MLP",
    "gpt": "workloads.gpt:GPT",
    "resnet": "workloads.resnet:ResNet",
}


class Workload:
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

    def build_model(self) -> torch.nn.Module:
        """A freshly initialised model (the harness seeds torch before calling this)."""
        raise NotImplementedError

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        """Synthetic rows for `split` ("train" or "val") as equal-length numpy columns."""
        raise NotImplementedError

    def split_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) from one batch of columns."""
        raise NotImplementedError

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean loss over the batch."""
        raise NotImplementedError

    # ---- optional -----------------------------------------------------------------------

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """Number of correct predictions (for accuracy), or None when accuracy has no meaning."""
        return (output.argmax(dim=-1) == target).sum()

    def flops_per_sample(self) -> float | None:
        """Training FLOPs per sample (forward + backward), for achieved FLOP/s and MFU."""
        return None

    def rows(self, split: str) -> int:
        """How many rows of `split` to store; the harness cycles through them."""
        return int(self.params.get(f"{split}_rows", 8192 if split == "train" else 2048))

    def preprocess(self, batch: dict[str, np.ndarray], training: bool) -> dict[str, np.ndarray]:
        """Stored rows -> model-ready columns (decode, normalise, augment when `training`).

        Runs in the input pipeline (Ray Data map tasks or torch DataLoader workers, with
        `data_workers` of them), never in the training step; the default passes rows through.
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

    @property
    def preprocesses(self) -> bool:
        """Whether this workload overrides `preprocess` (else the pipeline skips that stage)."""
        return type(self).preprocess is not Workload.preprocess


def resolve_workload(name: str) -> type[Workload]:
    """`mlp` or `package.module:Class` -> the Workload subclass, with one clear error."""
    target = REGISTERED.get(name, name)
    module_name, sep, class_name = target.partition(":")
    if not sep:
        close = difflib.get_close_matches(name, list(REGISTERED), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(
            f"workload: unknown workload {name!r}{hint}; use one of "
            f"{', '.join(REGISTERED)} or 'package.module:Class'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"workload: cannot import {module_name!r} ({e})") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Workload)):
        raise UserError(
            f"workload: {target!r} is not a subclass of amdahl.Workload in {module_name!r}"
        )
    return cls


def make_workload(name: str, params: dict[str, Any]) -> Workload:
    """Resolve and instantiate: parameter errors surface here, before any launch."""
    return resolve_workload(name)(**params)
