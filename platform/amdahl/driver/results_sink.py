"""The Tune callback through which a sweep's rows reach the driver.

A launch's workers report one row per trial repeat; Ray Train's `TuneReportCallback` forwards it
to the launch's Tune trial, and `ResultSink`, running here in the driver, hands it to the
driver's recorder, the only writer of results.parquet and MLflow. When a launch dies, the sink
records the trial it died in as failed (with the worker's own error line: `launch_error`) and
names the trials it had not reached, which the driver launches again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ray import tune

from amdahl.plan.launches import Launch
from amdahl.worker.contract import LaunchConfig
from amdahl.worker.rows import ROW_REPORT_KEY, failure_status, row_identity

#: Events the driver emits for whoever renders progress: (kind, payload).
EventHandler = Callable[[str, dict[str, Any]], None]


class ResultSink(tune.Callback):
    """Tune callback in the driver: every row a launch reports, or a crash leaves unreported,
    goes to `record` (launches.Measurement.record: results.parquet, then MLflow); a launch's
    start goes to `emit`, for the progress display."""

    def __init__(
        self,
        launches: dict[str, Launch],
        configs: dict[str, LaunchConfig],
        record: Callable[[dict[str, Any]], None],
        emit: EventHandler,
    ):
        self.launches, self.configs, self.record, self.emit = launches, configs, record, emit
        self.reported: dict[str, set[tuple[str, int]]] = {}
        self.relaunch: set[str] = set()  # trial ids a crashed launch had not reached

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks into its experiment state; this one lives only in the
        # driver (resume goes through results.parquet, not Tune's restore), so ship nothing.
        return {}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.emit("launch_started", {"launch": self.launches[trial.config["launch_id"]]})

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        if ROW_REPORT_KEY not in result:
            return
        row = json.loads(result[ROW_REPORT_KEY])
        launch_id = trial.config["launch_id"]
        self.reported.setdefault(launch_id, set()).add((row["trial_id"], row["repeat"]))
        self.record(row)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """The launch died (its worker group crashed past train.max_failures).

        Its runs go in `LaunchConfig.schedule` order, so the first it had not reported is the
        one it died in: that one is recorded as failed with the reason, and the trials with
        repeats it had not reached go to a new launch (`relaunch`), so one crash costs one
        trial run, not the whole group. A relaunch that dies in its first run again has a
        cause no trial escapes (a worker group that cannot start, say): then every repeat it
        had left is recorded as failed.
        """
        launch = self.configs[trial.config["launch_id"]]
        error = launch_error(trial)
        reported = self.reported.get(launch.launch_id, set())
        done = reported | set(launch.skip)
        pending = [(t, r) for t, r in launch.schedule() if (t.trial_id, r) not in done]
        failing = pending if launch.relaunch and not reported else pending[:1]
        self.relaunch.update(t.trial_id for t, _ in pending[len(failing) :])
        for t, repeat in failing:
            self.record(
                {**row_identity(launch, t, repeat), "status": failure_status(error), "error": error}
            )


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
    return "launch failed: " + lines[-1][:2000]
