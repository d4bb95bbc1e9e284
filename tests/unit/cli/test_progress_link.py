"""Where the CLI says MLflow shows a sweep: the `TrackingOpened` event (sent from the tracker's own
thread once the parent run exists) and the closing summary print the link, each line whole
(not wrapped, so it stays clickable) and as text (a store path may hold rich markup)."""

import io
import threading
from types import SimpleNamespace

import pytest
from rich.console import Console

from amdahl.cli import progress
from amdahl.driver.events import TrackingOpened
from amdahl.track.ui_link import tracking_link

STORE = "sqlite:////data/[runs]/a very long path that a narrow terminal would wrap/mlflow.db"


@pytest.fixture
def out(monkeypatch) -> io.StringIO:
    buf = io.StringIO()
    console = Console(file=buf, width=60, color_system=None, force_terminal=False)
    monkeypatch.setattr(progress, "console", console)
    return buf


def test_the_tracking_event_prints_the_command_and_the_link_from_another_thread(out):
    link = tracking_link(STORE, "3")
    with progress.LiveProgress() as live:
        sender = threading.Thread(target=live.event, args=(TrackingOpened(link),))
        sender.start()
        sender.join()
    lines = out.getvalue().splitlines()
    assert f"MLflow: mlflow ui --backend-store-uri '{STORE}'" in lines
    assert (
        "        then open "
        "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning" in lines
    )
    assert live.activity == ""  # the live table's state is not touched


def test_the_closing_summary_prints_the_link(out, tmp_path):
    link = tracking_link("https://mlflow.example.com", "3")
    outcome = SimpleNamespace(
        rows=[], wall_s=1.0, sweep_dir=tmp_path, failed=[], search=None, group_starts=0
    )
    progress.print_outcome(outcome)
    assert "MLflow" not in out.getvalue()  # tracking off: nothing to open
    progress.print_outcome(SimpleNamespace(**vars(outcome), tracking=link))
    url = "https://mlflow.example.com/#/experiments/3/runs?workflowType=machine_learning"
    assert f"MLflow: {url}" in out.getvalue().splitlines()
