"""Where users look: the link that opens a sweep's experiment on MLflow's runs table, and, for a
local store, the command that starts the UI over it (`tracking_link`). The CLI prints it when
the sweep's parent run exists and again when the sweep ends (docs/architecture.md, "Tracking").

MLflow 3.17's UI chooses between its GenAI view and its model-training view only from the
link's `?workflowType=` or the browser's saved switch (a new browser starts on GenAI, an empty
traces overview); the experiment's `mlflow.experimentKind` tag does not choose it. So the link
always carries `workflowType=machine_learning`.

Pure: no MLflow here, so the CLI can import it for free.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

#: Where `mlflow ui` listens unless told otherwise.
LOCAL_UI = "http://127.0.0.1:5000"
#: What makes MLflow 3.17's UI open the model-training view (its runs table), not GenAI's.
WORKFLOW = "workflowType=machine_learning"


@dataclass(frozen=True)
class TrackingLink:
    """`url` opens the experiment's runs table; `command`, for a store on this disk, starts the
    UI that serves it (None for a tracking server: the link is on that server)."""

    url: str
    command: str | None = None

    def lines(self) -> list[str]:
        """The link as the CLI prints it: one line, or the command then the link."""
        if self.command is None:
            return [f"MLflow: {self.url}"]
        return [f"MLflow: {self.command}", f"        then open {self.url}"]


def runs_page(ui: str, experiment_id: str) -> str:
    """The UI page of `experiment_id`'s runs table, on the UI at `ui`."""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs?{WORKFLOW}"


def tracking_link(store: str, experiment_id: str | None) -> TrackingLink | None:
    """The link for `experiment_id` in the tracking store `store` (its key without credentials,
    `track.mlflow_store.store_key`): on the server for an http(s) store (any user and password
    left out), on `mlflow ui`'s default address with the command for a local sqlite or file
    store. None when the experiment is not known yet or the store has no UI this can name
    (Databricks, a database server: its UI is wherever `mlflow server` runs)."""
    if not experiment_id:
        return None
    parts = urlsplit(store)
    if parts.scheme in ("http", "https"):
        try:
            port = f":{parts.port}" if parts.port else ""
        except ValueError:  # not a port: no link rather than a wrong one
            return None
        host = parts.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + port
        ui = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        return TrackingLink(runs_page(ui, experiment_id))
    if parts.scheme in ("sqlite", "file"):
        command = f"mlflow ui --backend-store-uri {shlex.quote(store)}"
        return TrackingLink(runs_page(LOCAL_UI, experiment_id), command)
    return None
