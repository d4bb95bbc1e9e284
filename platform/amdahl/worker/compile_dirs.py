"""Inductor's on-disk caches kept per configuration through a halving search, so that a compiled
configuration promoted to the next rung loads what its first rung compiled instead of compiling
it again (docs/architecture.md, "Search").

A compiled trial is never kept between rungs (driver.measurement.never_continues: each trial
starts by forgetting what earlier ones compiled), so a promoted one starts fresh. With
`options.compile_cache: cold` each trial compiles into empty caches, which at every rung would
pay inductor's whole code generation again (2.5 s a rung for an MLP on an H200, minutes for
large models). Here a search's compiled trial compiles into a directory of its own, kept for
the launch under its configuration and repeat: its first rung fills it (a cold compile, as
before), and its later rungs find their graphs there (dynamo still traces). Such a row says
`compile_cache: own` and its compile_s is the reload's; the report takes the configuration's
compile figures from its first rung (search.halving.final_rows). A configuration no later rung
can promote (its last item two rungs back) loses its directory. Grid sweeps, `continue_rungs:
false`, time-to-target searches and `compile_cache: warm` are unchanged.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path

from amdahl.protocol.contract import TrialConfig
from amdahl.protocol.items import WorkItem

#: At most this many configurations' caches at once on a rank (oldest out), beyond the rule
#: that drops those no later rung can promote: each can hold tens of MB of generated code.
MAX_KEPT = 64


class ConfigurationCaches:
    """This rank's inductor cache directories, by configuration and repeat, oldest first."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._dirs: OrderedDict[str, tuple[int, Path]] = OrderedDict()  # key -> (rung, dir)

    def directory(self, item: WorkItem, trial: TrialConfig) -> tuple[Path | None, bool]:
        """(the cache directory `item`'s trial compiles into, whether an earlier rung of the
        same configuration and repeat compiled into it); (None, False) where the driver did not
        ask for one (`WorkItem.own_compile_caches`: a search's compiled configuration) or the
        trial's caches are not cold."""
        if not item.own_compile_caches or trial.compile_cache != "cold":
            return None, False
        rung = item.rung or 0
        for key in [k for k, (last, _) in self._dirs.items() if last < rung - 1]:
            shutil.rmtree(self._dirs.pop(key)[1], ignore_errors=True)  # promoted no more
        key = f"{item.trial_id}/{item.repeat}"
        _, path = self._dirs.pop(key, (rung, None))
        compiled_before = path is not None and any(path.iterdir())
        if path is None:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="amdahl-compile-"))
            path = self._root / f"{item.trial_id}-{item.repeat}"
            path.mkdir(exist_ok=True)
        self._dirs[key] = (rung, path)
        while len(self._dirs) > MAX_KEPT:
            shutil.rmtree(self._dirs.popitem(last=False)[1][1], ignore_errors=True)
        return path, compiled_before

    def close(self) -> None:
        """Remove every directory (the launch ends)."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root, self._dirs = None, OrderedDict()


def fxgraph_cache_hits() -> int:
    """Inductor's FX graph cache hits so far in this process (dynamo's counters, which its
    per-trial reset leaves alone): what tells a reload from a compile."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"]
