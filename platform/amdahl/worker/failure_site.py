"""Where a trial failed in the user's code: the innermost traceback frame outside amdahl, torch,
Ray and the Python installation (a workload's model, data or loss: its file, line and function),
so that a failed row says `at model.py:187 in forward` on its first line, the line the live
table, the report and `platform report` show (issue 53: the traceback alone, in the `error`
column, named a torch internal three frames from the end).
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import traceback
from pathlib import Path
from types import TracebackType

import torch

#: Frames kept in the `error` column's traceback: from the user's frame on, at most this many.
TRACEBACK_FRAMES = 8


def _library_roots() -> tuple[str, ...]:
    """Directories whose files are not the user's: amdahl's package, torch, the standard
    library and every site-packages (Ray and the rest are installed there)."""
    roots = {
        Path(__file__).resolve().parents[1],  # the amdahl package
        Path(torch.__file__).parent,
        Path(sysconfig.get_paths()["stdlib"]),
        *(Path(p) for p in site.getsitepackages()),
        Path(sys.prefix),
    }
    user_site = site.getusersitepackages()
    if isinstance(user_site, str):
        roots.add(Path(user_site))
    return tuple(str(r.resolve()) + os.sep for r in roots)


_LIBRARY = _library_roots()


def user_frame(tb: TracebackType | None) -> traceback.FrameSummary | None:
    """The innermost frame of `tb` in the user's code, or None where every frame is a library's."""
    frames = traceback.extract_tb(tb)
    for frame in reversed(frames):
        path = str(Path(frame.filename).resolve())
        if not frame.filename.startswith("<") and not path.startswith(_LIBRARY):
            return frame
    return None


def site_text(frame: traceback.FrameSummary | None) -> str:
    """` (at model.py:187 in forward)`, or "" without a frame: for the error's first line."""
    if frame is None:
        return ""
    return f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})"


def failure_text(e: BaseException, first: str) -> str:
    """The `error` column of a failed trial: its first line with the user's frame, then the
    traceback from that frame on (at most TRACEBACK_FRAMES; the last ones where none is the
    user's), with the full path of the user's file."""
    frame = user_frame(e.__traceback__)
    frames = traceback.extract_tb(e.__traceback__)
    start = frames.index(frame) if frame is not None else max(0, len(frames) - 3)
    shown = traceback.StackSummary.from_list(frames[start : start + TRACEBACK_FRAMES])
    where = f"{frame.filename}:{frame.lineno}\n" if frame is not None else ""
    return (
        f"failed: {type(e).__name__}: {first}{site_text(frame)}\n{where}"
        + "".join(shown.format())
        + "".join(traceback.format_exception_only(e))  # the qualified name, as Python prints it
    )
