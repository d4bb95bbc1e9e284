"""Plan-time checks of a workload: its data path run on a few rows as every trial will run it
(`check_workload`), so that a wrong return type fails the plan, not every trial.

numpy and torch are imported inside `check_workload`: importing this module costs nothing.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from amdahl.errors import UserError
from amdahl.workload.api import Workload

#: Rows of each split `check_workload` generates.
CHECK_ROWS = 4


def check_workload(workload: Workload, seed: int = 0) -> None:
    """Run the data path on a few rows as every trial will, refusing what would fail there:
    `generate` must return a dict of equal-length numpy columns (CHECK_ROWS rows each, the same
    columns for train and val), `preprocess` a dict of equal-length numpy columns that become
    torch tensors, and `split_batch` an (inputs, targets) pair. `preprocess` (or, without one,
    `split_batch`) gets the rows as stored and read back by both inputs (`as_stored`). Splits
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
        rows = as_stored(rows)
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


def as_stored(rows: dict[str, Any]) -> dict[str, Any]:
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
