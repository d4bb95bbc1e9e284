"""The Workload API: what a user subclasses to put their own model under the platform.

A workload states its model, its data (synthetic rows the platform stores once as parquet, or the
user's own parquet through `params.data`), its loss, and optionally its preprocessing (run in the
input pipeline), its accuracy and FLOPs per sample. It never touches Ray, MLflow or timing:
the harness owns those, so every workload is measured the same way.

A workload is `Workload` subclass named as `package.module:Class` in the sweep file. Where the
driver finds its code and how Ray workers get the same code is `locate_workload`'s docstring;
`check_workload` calls it on a few rows at plan time, so a wrong return type fails the plan, not
every trial.

This module imports no torch at module level so the CLI and planner stay fast.
"""

from __future__ import annotations

import abc
import difflib
import importlib
import importlib.machinery
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
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

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """Number of correct predictions (for val_accuracy): argmax over the last dimension
        equal to the target. Return None where accuracy has no meaning (regression)."""
        return (output.argmax(dim=-1) == target).sum()

    def flops_per_sample(self) -> float | None:
        """Training FLOPs per sample (forward + backward) as you state them: compared with the
        counted figure (the report names both where they differ by more than 10%), and used
        for achieved FLOP/s and MFU only with `flops_override` or where counting failed."""
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


def resolve_workload(name: str, search: Iterable[str | Path] | None = None) -> type[Workload]:
    """`mlp` or `package.module:Class` -> the Workload subclass, with one clear error.

    The module is imported as it is (already imported, installed, or on sys.path), else looked
    for in `search` (default: the working directory) as `locate_workload` does.
    """
    _, module_name, _ = _target(name)
    if module_name not in sys.modules:
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if not _is_missing(e, module_name):
                raise UserError(_import_failed(module_name, e)) from None
            locate_workload(name, [Path.cwd()] if search is None else search)
        except Exception as e:  # noqa: BLE001 - the user's module failed to import
            raise UserError(_import_failed(module_name, e)) from None
    return _workload_class(name)


def _workload_class(name: str) -> type[Workload]:
    """The imported workload class, refused unless a complete Workload subclass."""
    target, module_name, class_name = _target(name)
    cls = getattr(sys.modules[module_name], class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Workload)):
        raise UserError(
            f"workload: {target!r} is not a subclass of amdahl.Workload in {module_name!r}"
        )
    missing = [m for m in REQUIRED if m in getattr(cls, "__abstractmethods__", ())]
    if missing:
        raise UserError(
            f"workload: {class_name} ({target!r}) does not implement {', '.join(missing)}; "
            f"a Workload must define {', '.join(REQUIRED)} (see the README's "
            "'Your own workload')"
        )
    return cls


def _target(name: str) -> tuple[str, str, str]:
    target = REGISTERED.get(name, name)
    module_name, sep, class_name = target.partition(":")
    if not sep or not module_name or not class_name:
        close = difflib.get_close_matches(name, list(REGISTERED), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(
            f"workload: unknown workload {name!r}{hint}; use one of "
            f"{', '.join(REGISTERED)} or 'package.module:Class'"
        )
    return target, module_name, class_name


# --------------------------------------------------------------------------- the user's code

#: Top-level packages of this distribution: importable wherever amdahl is, never shipped.
_BUILT_IN = frozenset({"amdahl", "workloads"})
#: Most bytes of code shipped to Ray workers: more means data, checkpoints or a virtualenv sit
#: inside the package, and every node would download them before every worker starts.
MAX_SHIPPED_BYTES = 100 * 2**20
#: Left out of what is shipped (gitignore patterns, as Ray's runtime_env `excludes` reads them).
SHIP_EXCLUDES = ("__pycache__", "*.pyc", ".git", ".ipynb_checkpoints", ".venv")


@dataclass(frozen=True)
class WorkloadCode:
    """Where a workload's module came from, and what Ray workers need of it."""

    module: str
    #: the directory it was found in (workload_path, the sweep file's, the working directory
    #: or a sys.path entry); None: installed or built in, nothing to ship
    root: Path | None
    #: top-level packages (directories) and modules (.py files) shipped to every worker
    ship: tuple[Path, ...] = ()

    def runtime_env(self) -> dict[str, Any] | None:
        """The Ray runtime_env that gives every worker this code, or None."""
        if not self.ship:
            return None
        return {"py_modules": [str(p) for p in self.ship], "excludes": list(SHIP_EXCLUDES)}


def workload_search_path(
    workload_path: str | Path | None = None, source_dir: str | Path | None = None
) -> list[Path]:
    """Where the driver looks for a workload's code, first match wins: `workload_path`, the
    sweep file's directory (`source_dir`), the working directory."""
    dirs = [Path(d).expanduser().resolve() for d in (workload_path, source_dir) if d]
    dirs.append(Path.cwd().resolve())
    return list(dict.fromkeys(dirs))


def locate_workload(name: str, search: Iterable[str | Path] = ()) -> WorkloadCode:
    """Import the workload's module in this process and say what Ray workers need of it.

    The driver: a built-in, standard-library or installed top-level package is imported as
    installed. Otherwise the first directory of `search` holding it (`mypkg/` or `mypkg.py`)
    wins and goes first on sys.path: for the CLI that is `workload_path`, then the sweep
    file's directory (where users keep code next to the YAML), then the working directory
    (`workload_search_path`). Else whatever sys.path already finds (PYTHONPATH).

    The workers: code that is not installed is shipped through Ray's runtime_env as
    `py_modules`, one entry per top-level package or module the import loaded from that
    directory (the workload's own, and sibling modules it imports at module level). Ray
    uploads each once per content hash and puts it first on every worker's import path, on
    every node, so a laptop and a cluster run the same code, and nothing else of the folder
    travels: not the sweep's `runs/`, data or a virtualenv, as `working_dir` would take (and
    `working_dir` would also change the workers' current directory). Shipped code is checked
    against MAX_SHIPPED_BYTES here, before Ray packs it.
    """
    _, module_name, _ = _target(name)
    top = module_name.partition(".")[0]
    built_in = top in _BUILT_IN or top in sys.stdlib_module_names
    dirs = [] if built_in else [Path(d).expanduser().resolve() for d in search]
    root = next((d for d in dirs if _holds(d, top)), None)
    if root is not None and top in _installed():
        root = None  # an installed package of that name wins: the nodes have it too
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if module_name not in sys.modules:
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if not _is_missing(e, module_name):
                raise UserError(_import_failed(module_name, e)) from None
            looked = f"{top}/ or {top}.py in {', '.join(str(d) for d in dirs)}, then "
            raise UserError(
                f"workload: cannot import {module_name!r} ({e}); looked for "
                f"{looked if dirs else ''}on sys.path: put the code next to the sweep "
                "file, run from its folder, or set `workload_path: DIR` in the sweep file"
            ) from None
        except Exception as e:  # noqa: BLE001 - the user's module failed to import
            raise UserError(_import_failed(module_name, e)) from None
    _workload_class(name)  # the class and its methods
    if built_in:
        return WorkloadCode(module_name, None)
    where = _location(sys.modules[top])
    if root is None and where is not None and top not in _installed():
        root = where.parent if where.name != "__init__.py" else where.parent.parent
        if _is_installed_path(root):
            root = None
    if root is not None and where is not None and not where.is_relative_to(root):
        raise UserError(
            f"workload: {top!r} was already imported from {where}, not from {root}; "
            f"another module of that name exists: rename your package or module"
        )
    ship = tuple(_shipped(root)) if root is not None else ()
    _check_size(ship)
    return WorkloadCode(module_name, root, ship)


def locate_spec_workload(spec: Any) -> WorkloadCode:
    """`locate_workload` for a SweepSpec: its workload_path, its file's directory, the cwd."""
    if spec.workload_path is not None and not Path(spec.workload_path).expanduser().is_dir():
        raise UserError(
            f"workload_path: {spec.workload_path} is not a directory; point it at the folder "
            "holding the workload's package or module (relative paths: to the sweep file)"
        )
    search = workload_search_path(spec.workload_path, spec.source_dir)
    return locate_workload(spec.workload, search)


def _holds(directory: Path, top: str) -> bool:
    return importlib.machinery.PathFinder.find_spec(top, [str(directory)]) is not None


def _location(module: Any) -> Path | None:
    """A module's file, or a namespace package's (first) directory."""
    file = getattr(module, "__file__", None)
    if file:
        return Path(file).resolve()
    paths = list(getattr(module, "__path__", []))
    return Path(paths[0]).resolve() / "__init__.py" if paths else None


def _shipped(root: Path) -> Iterable[Path]:
    """Top-level packages and modules loaded from `root`: what workers need to import."""
    for name, module in list(sys.modules.items()):
        if "." in name or name in _BUILT_IN:
            continue
        where = _location(module)
        if where is None or not where.is_relative_to(root):
            continue
        rel = where.relative_to(root).parts
        if len(rel) == 1 and rel[0] == f"{name}.py":
            yield root / rel[0]
        elif len(rel) > 1 and rel[0] == name and name not in _installed():
            yield root / name


def _check_size(ship: tuple[Path, ...]) -> None:
    for entry in ship:
        files = [entry] if entry.is_file() else [f for f in entry.rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files if not _excluded(f.relative_to(entry.parent)))
        if size > MAX_SHIPPED_BYTES:
            raise UserError(
                f"workload: {entry} holds {size / 2**20:.0f} MiB, more than the "
                f"{MAX_SHIPPED_BYTES / 2**20:.0f} MiB of code amdahl ships to every Ray worker; "
                "move data, checkpoints or environments out of the package (point "
                "params.data at data), or install the package on every node"
            )


def _excluded(rel: Path) -> bool:
    return any(p in SHIP_EXCLUDES for p in rel.parts) or rel.suffix == ".pyc"


@lru_cache(maxsize=1)
def _installed() -> frozenset[str]:
    """Top-level names installed distributions provide (editable installs included)."""
    import importlib.metadata

    return frozenset(importlib.metadata.packages_distributions())


def _is_installed_path(directory: Path) -> bool:
    import sysconfig

    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if key in paths and directory.is_relative_to(Path(paths[key]).resolve()):
            return True
    return False


def _is_missing(error: ModuleNotFoundError, module_name: str) -> bool:
    """Whether the error is the workload's own module (or a parent package) not being there,
    as opposed to a module the workload imports."""
    parts = module_name.split(".")
    return error.name in {".".join(parts[: i + 1]) for i in range(len(parts))}


def _import_failed(module_name: str, error: BaseException) -> str:
    """One line: the exception and where in the user's code it was raised."""
    frames = traceback.extract_tb(error.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename]
    where = ""
    if user and not isinstance(error, SyntaxError):  # a SyntaxError names its place
        where = f" at {user[-1].filename}:{user[-1].lineno}"
    return f"workload: cannot import {module_name!r} ({type(error).__name__}: {error}{where})"


# --------------------------------------------------------------------------- plan-time checks

#: Rows of each split `check_workload` generates.
CHECK_ROWS = 4


def check_workload(workload: Workload, seed: int = 0) -> None:
    """Run the data path on a few rows as every trial will, refusing what would fail there:
    `generate` must return a dict of equal-length numpy columns (CHECK_ROWS rows each, the same
    columns for train and val), `preprocess` a dict of equal-length numpy columns that become
    torch tensors, and `split_batch` an (inputs, targets) pair. `preprocess` (or, without one,
    `split_batch`) gets the rows as stored and read back by both inputs (`_as_stored`). Splits
    read from `params.data` are not generated, so not checked."""
    import numpy as np
    import torch

    cls = type(workload).__name__
    _check_stated_flops(cls, workload)
    columns: dict[str, set[str]] = {}
    for split in ("train", "val"):
        if workload.source(split) is not None:
            continue
        call = f"{cls}.generate({split!r}, {CHECK_ROWS}, seed={seed})"
        rows = _call(call, workload.generate, split, CHECK_ROWS, seed)
        _check_columns(call, rows, np, CHECK_ROWS)
        columns[split] = set(rows)
        if len(columns) == 2 and columns["train"] != columns["val"]:
            raise UserError(
                f"workload: {cls}.generate gives train the columns {sorted(columns['train'])} "
                f"but val {sorted(columns['val'])}; both splits need the same columns"
            )
        rows = _as_stored(rows)
        if workload.preprocesses:
            call = f"{cls}.preprocess(<{split} rows>, training={split == 'train'})"
            rows = _call(call, workload.preprocess, rows, split == "train")
            _check_columns(call, rows, np, None)
        try:
            batch = {k: torch.as_tensor(v) for k, v in rows.items()}
        except (TypeError, ValueError, RuntimeError) as e:
            raise UserError(
                f"workload: {call}: a column cannot become a torch tensor, as the input "
                f"pipeline makes it before split_batch ({e}); return numeric numpy arrays"
            ) from None
        call = f"{cls}.split_batch(<{split} batch>)"
        pair = _call(call, workload.split_batch, batch)
        if not (isinstance(pair, tuple | list) and len(pair) == 2):
            got = f"a {type(pair).__name__}" + (
                f" of {len(pair)}" if isinstance(pair, tuple | list) else ""
            )
            raise UserError(
                f"workload: {call} returned {got}; it must return a pair (inputs, targets): "
                "the model is called on inputs, loss(output, targets)"
            )


def _check_stated_flops(cls: str, workload: Workload) -> None:
    """A workload whose stated FLOPs override the count must state a figure."""
    if not workload.flops_override:
        return
    stated = _call(f"{cls}.flops_per_sample()", workload.flops_per_sample)
    if isinstance(stated, bool) or not isinstance(stated, int | float) or not stated > 0:
        raise UserError(
            f"workload: {cls} sets flops_override = True but {cls}.flops_per_sample() returned "
            f"{stated!r}; return its training FLOPs per sample (a positive number), or drop "
            "flops_override so that MFU uses the counted figure"
        )


def _as_stored(rows: dict[str, Any]) -> dict[str, Any]:
    """Generated columns as every trial reads them back, under either input: a column of more
    than two dimensions is stored as a fixed-size list of its flattened rows
    (`data.storage.arrow_column`) and read back as (rows, width) (`table_columns`)."""
    return {k: v.reshape(len(v), -1) if v.ndim > 2 else v for k, v in rows.items()}


def _call(call: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the user's code raised: one line, with where
        frames = traceback.extract_tb(e.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        raise UserError(f"workload: {call} raised {type(e).__name__}: {e}{where}") from None


def _check_columns(call: str, rows: Any, np: Any, num_rows: int | None) -> None:
    if not isinstance(rows, dict) or not rows:
        raise UserError(
            f"workload: {call} returned {type(rows).__name__}; it must return a non-empty "
            "dict of numpy arrays, one per column, e.g. {'x': features, 'y': labels}"
        )
    lengths = {}
    for key, value in rows.items():
        if not isinstance(value, np.ndarray):
            raise UserError(
                f"workload: {call}: column {key!r} is a {type(value).__module__}."
                f"{type(value).__name__}, not a numpy array; return np.asarray(...) "
                "(a torch tensor: .numpy())"
            )
        lengths[key] = len(value) if value.ndim else 0
    expected = num_rows if num_rows is not None else max(lengths.values())
    wrong = {k: n for k, n in lengths.items() if n != expected}
    if wrong:
        key, n = next(iter(wrong.items()))
        raise UserError(
            f"workload: {call}: column {key!r} has {n} rows, expected {expected}; every "
            f"column holds one entry per row ({', '.join(f'{k}: {v}' for k, v in lengths.items())})"
        )


def make_workload(name: str, params: dict[str, Any]) -> Workload:
    """Resolve and instantiate: parameter errors surface here, before any launch."""
    return resolve_workload(name)(**params)
