"""What Tune tells the driver about its launches.

`LaunchWatch` is a Tune callback (it runs in Tune's thread, driver/pool.py's background
thread): which launches started and ended, and why one failed (`launch_error`, the worker's own
error line). Rows do not come through Tune: the workers hand them to the driver's work queue.
"""

from __future__ import annotations

import os
import re
import threading
from collections import deque
from typing import Any

from ray import tune


class LaunchWatch(tune.Callback):
    """Tune callback (it runs in Tune's thread): which launches started and ended, and why a
    launch failed; the driver's thread reads them with `drain`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: deque[tuple[str, str, str]] = deque()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # lives in the driver only (Tune pickles its callbacks into its state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()

    def _add(self, kind: str, trial: Any, detail: str = "") -> None:
        with self._lock:
            self._events.append((kind, trial.config["launch_id"], detail))

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._add("started", trial)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._add("ended", trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._add("failed", trial, launch_error(trial))

    def drain(self) -> list[tuple[str, str, str]]:
        with self._lock:
            events, self._events = list(self._events), deque()
        return events


def launch_error(trial: Any) -> str:
    """The last line of the launch's error (e.g. a worker's exception). Tune writes it to the
    trial's local error file before calling `on_trial_error`; its storage copy (`get_error`)
    is synced later, so the local file comes first."""
    text = ""
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if not text:
        error = trial.get_error() if hasattr(trial, "get_error") else None
        text = str(error) if error else ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return (
            "launch failed: the launch's worker group failed without an error; see ray.log in "
            "the sweep directory"
        )
    # Ray Train lists each failed rank's error under "[Rank N Error Snippet]:"; the last line
    # is the last rank's, named, so a dead rank's "The actor is dead" says which rank it was
    ranks = _SNIPPET.findall(text)
    who = f"rank {ranks[-1]}: " if ranks else ""
    return "launch failed: " + who + lines[-1][:2000]


_SNIPPET = re.compile(r"^\[Rank (\d+) Error Snippet\]:", re.MULTILINE)
