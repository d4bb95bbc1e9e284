"""What a workload's `preprocess` depends on, found by running it, where the workload does not
declare `preprocess_params` (docs/architecture.md, "Launches").

Undeclared, every parameter was taken to change preprocessing, so a sweep over a model width
started one launch (a worker group, an input pipeline) per width although `preprocess` never
read it; users do not know to declare it. Planning now runs `preprocess` on a few generated rows
of each split for each parameter set (seeded, with `params` recording the keys it reads): two
parameter sets share an input pipeline where they store the same rows, `preprocess` read the
same values of the same keys, the instances hold the same other attributes, and it returned the
same columns for training and for validation. A parameter read another way shows in the key
where `__init__` copied it into an attribute, else in the output where it changes it on the
probed rows; a value read only on a branch those rows never take is missed (declare
`preprocess_params` then). A workload whose training rows come from `params.data` is not
sampled at plan time: every parameter keeps counting, as before.

numpy, torch's CPU generator and random are seeded for each call and restored afterwards.
"""

from __future__ import annotations

import hashlib
import pickle
import random
from typing import Any

from amdahl.workload.api import Workload
from amdahl.workload.data_checks import as_stored

#: Rows of each split `preprocess` is probed on.
PROBE_ROWS = 16


class _RecordingParams(dict):
    """A workload's `params` that remembers the keys read (iterating reads them all)."""

    def __init__(self, params: dict[str, Any]):
        super().__init__(params)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)

    def _all(self) -> None:
        self.read.update(super().keys())

    def __iter__(self):
        self._all()
        return super().__iter__()

    def keys(self):
        self._all()
        return super().keys()

    def items(self):
        self._all()
        return super().items()

    def values(self):
        self._all()
        return super().values()

    def copy(self) -> dict[str, Any]:
        self._all()
        return dict(super().items())


def input_key(workload: Workload) -> dict[str, Any]:
    """What decides a parameter set's input batches: Workload.input_key where the workload
    declares `preprocess_params`, has no `preprocess` or reads its rows from `params.data`;
    else the stored rows' parameters, the parameters `preprocess` read (with their values) and
    a digest of what it returned for a few rows (`sampled_preprocess`)."""
    if (
        not workload.preprocesses
        or workload.preprocess_params is not None
        or workload.source("train") is not None
    ):
        return workload.input_key()
    sampled = sampled_preprocess(workload)
    if sampled is None:
        return workload.input_key()
    read, digest = sampled
    return {
        "data": workload.data_key(),
        "preprocess": {k: workload.params[k] for k in sorted(read) if k in workload.params},
        "output": digest,
    }


def sampled_preprocess(workload: Workload, seed: int = 0) -> tuple[set[str], str] | None:
    """(the parameters `preprocess` read, a digest of the instance's attributes and of its
    output on PROBE_ROWS generated rows of each split, training and validation); None where
    generating or preprocessing raised (the plan's data checks report that)."""
    import numpy as np
    import torch

    params = workload.params
    recording = _RecordingParams(params)
    digest = hashlib.sha256(_state_digest(workload))
    states = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):  # the CPU generator only: no CUDA touched
            for split, training in (("train", True), ("val", False)):
                rows = as_stored(workload.generate(split, PROBE_ROWS, seed))
                random.seed(seed)
                np.random.seed(seed)
                torch.random.default_generator.manual_seed(seed)
                workload.params = recording
                out = workload.preprocess({k: v.copy() for k, v in rows.items()}, training)
                workload.params = params
                digest.update(_columns_digest(out))
    except Exception:  # noqa: BLE001 - reported by check_workload
        return None
    finally:
        workload.params = params
        random.setstate(states[0])
        np.random.set_state(states[1])
    return recording.read, digest.hexdigest()


def _state_digest(workload: Workload) -> bytes:
    """The instance's own attributes but `params` (what `__init__` may have copied out of
    them): pickled where they can be, else their repr (which, holding addresses, differs
    between instances: no sharing, the safe side)."""
    state = {k: v for k, v in vars(workload).items() if k != "params"}
    try:
        return pickle.dumps(sorted(state.items()))
    except Exception:  # noqa: BLE001 - anything unpicklable
        return repr(sorted(state.items(), key=lambda kv: kv[0])).encode()


def _columns_digest(columns: Any) -> bytes:
    """Bytes that differ where the columns (names, dtypes, shapes, values) do."""
    import numpy as np

    if not isinstance(columns, dict):
        return pickle.dumps(columns)
    h = hashlib.sha256()
    for name in sorted(columns):
        value = columns[name]
        h.update(str(name).encode())
        if isinstance(value, np.ndarray) and value.dtype != object:
            h.update(f"{value.dtype}{value.shape}".encode())
            h.update(np.ascontiguousarray(value).tobytes())
        else:
            h.update(pickle.dumps(value))
    return h.digest()
