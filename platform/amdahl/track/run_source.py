"""Who ran a sweep and from what: the tags MLflow shows in its runs table's User and Source
columns (`mlflow.user`, `mlflow.source.name`, `mlflow.source.type`, and
`mlflow.source.git.commit` when the workload's code sits in a git checkout).

Apart from the mirror's mechanism because MLflow's client fills these in only for runs started
with `mlflow.start_run`; `MlflowClient.create_run`, which the mirror uses, records the user as
"unknown" and no source. So they are found here, once per tracker: the user from the login
(`getpass`), the source from the sweep file, the commit with `git rev-parse HEAD` in the
workload's folder (no git, no checkout, a folder git ignores (an installed package inside a
virtualenv): no commit tag).
"""

from __future__ import annotations

import getpass
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amdahl.workload.code import REGISTERED, workload_search_path

#: MLflow's source type for a run started on this machine.
LOCAL = "LOCAL"
_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


@dataclass(frozen=True)
class RunSource:
    """The user, the sweep file (or the Python program that built the spec) and the workload
    code's git commit (None outside a checkout)."""

    user: str
    name: str
    git_commit: str | None = None

    def tags(self) -> dict[str, str]:
        tags = {"mlflow.user": self.user, "mlflow.source.name": self.name}
        tags["mlflow.source.type"] = LOCAL
        if self.git_commit:
            tags["mlflow.source.git.commit"] = self.git_commit
        return tags


def run_source(spec: Any) -> RunSource:
    """The source of `spec`'s runs (a `SweepSpec`; see the module's docstring)."""
    folder = workload_dir(spec)
    return RunSource(
        user=login_user(),
        name=str(spec.source_file or _program()),
        git_commit=git_commit(folder) if folder is not None else None,
    )


def login_user() -> str:
    """The login name (`getpass.getuser`: LOGNAME, USER, ... then the password database), else
    the numeric user id: a container without a passwd entry for its user has no name."""
    try:
        return getpass.getuser()
    except (OSError, KeyError, ImportError):
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


def _program() -> str:
    """For a spec built in Python: the program that runs the sweep."""
    main = sys.argv[0] if sys.argv and sys.argv[0] else ""
    return os.path.abspath(main) if main and os.path.exists(main) else "python"


def workload_dir(spec: Any) -> Path | None:
    """The folder of `spec`'s workload module, found as the driver finds it
    (`amdahl.workload.code.locate_workload`: its workload_path, the sweep file's folder, the working
    directory, then sys.path), without importing it; None when it cannot be found."""
    target = REGISTERED.get(spec.workload, spec.workload)
    module = target.partition(":")[0]
    loaded = sys.modules.get(module)
    origin = getattr(loaded, "__file__", None)
    if origin is None:
        top = module.partition(".")[0]
        dirs = [str(d) for d in workload_search_path(spec.workload_path, spec.source_dir)]
        try:
            found = importlib.machinery.PathFinder.find_spec(top, dirs)
            found = found or importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
        origin = found.origin if found is not None else None
        if origin is None and found is not None and found.submodule_search_locations:
            return Path(list(found.submodule_search_locations)[0])
    if origin in (None, "built-in", "frozen"):
        return None
    return Path(origin).resolve().parent


def git_commit(folder: Path) -> str | None:
    """HEAD's commit of the git checkout holding `folder`, or None: no git, not a checkout, a
    folder the checkout ignores, or git failing in any way."""

    def git(*args: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(
                ["git", "-C", str(folder), *args],
                capture_output=True,
                text=True,
                timeout=10,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "HEAD")
    if head is None or head.returncode != 0 or not _COMMIT.match(head.stdout.strip()):
        return None
    ignored = git("check-ignore", "-q", ".")
    if ignored is not None and ignored.returncode == 0:
        return None  # an installed package in a virtualenv inside someone's checkout
    return head.stdout.strip()
