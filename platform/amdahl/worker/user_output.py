"""The workload's own prints while its model is built (a parameter count, a config dump), once
per process: a worker builds the model for every trial of its launch and again to count its
FLOPs, and the driver's memory probe builds it per precision, so an unguarded `print` in
`build_model` ran 8-9 times into a sweep's terminal (issue 53). The same text again is dropped;
different text (another size of model) is printed.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator

_SEEN: set[str] = set()


@contextlib.contextmanager
def printed_once() -> Iterator[None]:
    """Capture stdout for the block; write it out unless this process has printed it before."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            yield
    finally:
        text = captured.getvalue()
        if text and text not in _SEEN:
            _SEEN.add(text)
            sys.stdout.write(text)
