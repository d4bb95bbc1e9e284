"""Inductor's on-disk caches kept per configuration through a halving search, so that a compiled
configuration promoted to the next rung loads what its first rung compiled instead of compiling
it again (docs/architecture.md, "Search").

A compiled trial is never kept between rungs (driver.measurement.never_continues: each trial
starts by forgetting what earlier ones compiled), so a promoted one starts fresh. With
`options.compile_cache: cold` each trial compiles into empty caches, which at every rung would
pay inductor's whole code generation again (2.5 s a rung for an MLP on an H200, minutes for
large models). Here a search's compiled trial compiles into a directory of its own, kept for
the launch under its configuration and repeat: its first rung fills it (a cold compile, as
before), and its later rungs find their graphs there (dynamo still traces, and the row's
compile_s counts that and the cache loads). Grid sweeps and `compile_cache: warm` are unchanged.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path

from amdahl.protocol.contract import TrialConfig
from amdahl.protocol.items import WorkItem

#: Configurations whose caches a rank keeps at once (oldest out): a halving search promotes a
#: few of a rung's configurations, and each directory can hold tens of MB of generated code.
MAX_KEPT = 16


class ConfigurationCaches:
    """This rank's inductor cache directories, by configuration and repeat, oldest first."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._dirs: OrderedDict[str, Path] = OrderedDict()

    def directory(self, item: WorkItem, trial: TrialConfig) -> tuple[Path | None, bool]:
        """(the cache directory `item`'s trial compiles into, whether an earlier rung of the
        same configuration and repeat compiled into it); (None, False) where the trial is not a
        search's compiled trial with cold caches."""
        if item.rung is None or trial.compile_cache != "cold":
            return None, False
        key = f"{item.trial_id}/{item.repeat}"
        path = self._dirs.pop(key, None)
        reused = path is not None and any(path.iterdir())
        if path is None:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="amdahl-compile-"))
            path = self._root / f"{item.trial_id}-{item.repeat}"
            path.mkdir(exist_ok=True)
        self._dirs[key] = path
        while len(self._dirs) > MAX_KEPT:
            _, oldest = self._dirs.popitem(last=False)
            shutil.rmtree(oldest, ignore_errors=True)
        return path, reused

    def close(self) -> None:
        """Remove every directory (the launch ends)."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root, self._dirs = None, OrderedDict()
