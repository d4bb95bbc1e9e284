"""Finding a workload's code and shipping it to Ray workers: `resolve_workload` and
`make_workload` (a sweep file's `workload:` name to its class, and an instance), and
`locate_workload` (where the driver imports the user's code from, and what Ray workers need of
it: `WorkloadCode`).

A wrong name, a module that cannot be imported, or a class that is no complete `Workload`
subclass is one UserError, before anything launches.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.machinery
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from amdahl.errors import UserError
from amdahl.workload.api import REQUIRED, Workload

#: Short names usable as `workload:` in a sweep file.
REGISTERED: dict[str, str] = {
    "mlp": "workloads.mlp:MLP",
    "gpt": "workloads.gpt:GPT",
    "resnet": "workloads.resnet:ResNet",
    "simulated": "workloads.simulated:SimulatedAccelerator",
}


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
            f"a Workload must define {', '.join(REQUIRED)} (see docs/workload.md, "
            "'The Workload API')"
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


def make_workload(name: str, params: dict[str, Any]) -> Workload:
    """Resolve and instantiate: parameter errors surface here, before any launch."""
    return resolve_workload(name)(**params)


# --------------------------------------------------------------------------- locating and shipping

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
        _import_user_module(module_name, top, dirs)
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


def _import_user_module(module_name: str, top: str, dirs: list[Path]) -> None:
    """Import the workload's module, any failure one UserError saying where it looked."""
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
