"""Ctrl-C and SIGTERM during a sweep: the first stops it cleanly, a second at once.

`InterruptFlag` is both the signal handler the driver installs for the sweep and the Tune
stopper that ends the running launch; `SweepInterrupted` is what `run_sweep` raises once the
sweep has closed after such a stop (rows kept, report written, MLflow parent run KILLED), so the
CLI can print how to resume and exit 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ray import tune


class SweepInterrupted(Exception):
    """Ctrl-C (SIGINT) or SIGTERM (`ray job stop`, a batch scheduler) stopped the sweep;
    everything finished so far is saved in `sweep_dir`. `exit_code`: 128 + the signal number."""

    def __init__(self, sweep_dir: Path, signum: int = signal.SIGINT):
        self.sweep_dir, self.signum = sweep_dir, int(signum)
        self.exit_code = 128 + int(signum)
        self.reason = (
            "interrupted"
            if signum == signal.SIGINT
            else f"stopped by {signal.Signals(signum).name}"
        )
        super().__init__(f"{self.reason}; finished trials are saved in {sweep_dir}")


class InterruptFlag(tune.Stopper):
    """First Ctrl-C or SIGTERM (what `ray job stop` and batch schedulers send): Tune stops
    scheduling and ends the running launch, and the sweep closes as after Ctrl-C (rows kept,
    report written, MLflow parent run marked KILLED). Second signal: stop at once.

    Rows already written stay intact: results.parquet is only ever replaced atomically.
    """

    #: The signals that stop a sweep cleanly; `signum` is the first one received.
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum: int | None = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def __call__(self, trial_id: str, result: dict) -> bool:
        return self._event.is_set()

    def stop_all(self) -> bool:
        return self._event.is_set()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # lives in the driver only (Tune pickles its stoppers into its state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._event = threading.Event()
        self.signum = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # Handlers set outside Python read as None; SIG_DFL is what they stand for here.
        previous = {s: signal.getsignal(s) or signal.SIG_DFL for s in self.SIGNALS}

        def first(signum: int, frame: Any) -> None:
            self.signum = signum
            self._event.set()
            # A second signal stops at once: Ctrl-C raises KeyboardInterrupt, SIGTERM gets
            # the handler it had before (Ray's driver exits on it).
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous[signal.SIGTERM])

        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        for s in self.SIGNALS:
            signal.signal(s, first)
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
