"""Where users look: the MLflow link amdahl prints opens the sweep's runs table in a real
browser, and the runs filter as numbers there.

No Ray: the Tracker is driven directly with results rows (a weak-scaling sweep, two repeats
each) into a SQLite store, as a sweep's driver does. The test then starts the UI with the very
command the tracker prints for that store (`mlflow ui --backend-store-uri ...`, on a free port of
127.0.0.1 instead of 5000), opens the printed link in headless Chromium and reads the page; then
it logs a second sweep through that server (an http tracking URI, whose link is on the server
itself) and opens that link too.

What it asserts: the link opens the model-training view (not MLflow 3.17's GenAI overview), on
the experiment's runs table; with `searchFilter=metrics.devices >= 2` added (and sorted by a
metric, so the children are listed on their own rather than folded under their parent), the
table lists exactly the multi-device child runs. What it cannot: grouping by `amdahl.config`;
MLflow 3.17 keeps the runs table's grouping in the browser's stored view state, not in the
URL (its URL carries searchFilter, orderByKey, orderByAsc, startTime, lifecycleFilter,
modelVersionFilter, datasetsFilter only), so the grouping is checked on the store's tags in
tests/unit/track.

Skipped when Chromium is not installed.
"""

from __future__ import annotations

import html
import json
import re
import shlex
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow_server import free_port, stop, wait_until_healthy
from report_rows import scaling_rows, write_sweep

from amdahl.spec.load import validate_spec
from amdahl.track.tracker import Tracker
from amdahl.track.ui_link import LOCAL_UI, TrackingLink

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else shutil.which("chromium")
#: Text only MLflow's GenAI overview shows (traces, token usage), not its runs table.
GENAI_OVERVIEW = ("Token Usage", "Tokens per Trace")


def _rows() -> list[dict]:
    rows = []
    for r in scaling_rows():
        for repeat in (0, 1):
            history = {"step": [1, 2], "loss": [2.0, 1.0], "elapsed_s": [0.1, 0.2]}
            rows.append(
                {
                    **r,
                    "repeat": repeat,
                    "started_at": "2026-01-02T03:04:05+00:00",
                    "history": json.dumps(history),
                }
            )
    return rows


def _run_name(r: dict) -> str:
    return f"d{r['devices']}-b{r['batch_size']}-fp32-eager-{r['sync']}-r{r['repeat']}"


def _track(sweep_dir: Path, experiment: str, rows: list[dict], uri: str | None) -> TrackingLink:
    """Mirror `rows` as a sweep's driver does; the link the tracker hands the CLI."""
    spec = {"name": experiment, "workload": "mlp", "tracking": {"experiment": experiment}}
    if uri:
        spec["tracking"]["uri"] = uri
    heard: list[TrackingLink] = []
    tracker = Tracker(validate_spec(spec), write_sweep(sweep_dir, rows), on_open=heard.append)
    tracker.open_soon()
    for row in rows:
        tracker.log_trial_soon(row)
    tracker.finish(SimpleNamespace(rows=rows, wall_s=1.0, failed=[]))
    assert tracker.error is None and tracker.offline_reason is None, tracker.error
    assert heard == [tracker.link]
    return heard[0]


def _start_ui(command: str, port: int, log: Path) -> subprocess.Popen:
    """The printed `mlflow ui ...` command, on `port`, as a child process of its own group; one
    server process (uvicorn's supervisor kills a worker that misses a health check, which a
    loaded test machine makes happen)."""
    args = shlex.split(command)
    assert args[:2] == ["mlflow", "ui"], command
    argv = [sys.executable, "-m", "mlflow", *args[1:], "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--workers", "1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return wait_until_healthy(proc, port, log, timeout=180)


def _page_text(url: str, profile: Path) -> str:
    """The page's text once headless Chromium has run its scripts (20 s of virtual time)."""
    profile.mkdir(parents=True)
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
            "--virtual-time-budget=20000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", done.stdout, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text)))


def _filtered(url: str, search: str) -> str:
    return f"{url}&searchFilter={urllib.parse.quote(search)}"


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
)
def test_the_printed_link_opens_the_runs_table_and_runs_filter_by_devices(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the sweep file's URI counts
    rows = _rows()
    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    local = _track(tmp_path / "local-1", "local", rows, uri)
    assert local.command == f"mlflow ui --backend-store-uri {uri}"
    assert local.url.startswith(f"{LOCAL_UI}/#/experiments/")
    assert local.url.endswith("/runs?workflowType=machine_learning")

    port = free_port()
    ui = _start_ui(local.command, port, tmp_path / "ui.log")
    try:
        base = f"http://127.0.0.1:{port}"
        page = local.url.replace(LOCAL_UI, base)
        table = _page_text(page, tmp_path / "a")
        assert not [t for t in GENAI_OVERVIEW if t in table], table[:2000]
        assert "local-1" in table, table[:2000]  # the sweep's parent run
        assert f"{len(rows) + 1} matching runs" in table, table[:2000]

        # Filtered, the table nests the matching children under their parent (counted too);
        # sorted by a metric it lists them on their own, so their names can be read.
        filtered = _filtered(page, "metrics.devices >= 2")
        nested = _page_text(filtered, tmp_path / "b0")
        assert f"{sum(r['devices'] >= 2 for r in rows) + 1} matching runs" in nested, nested[:2000]
        multi = _page_text(f"{filtered}&orderByKey=metrics.%60devices%60", tmp_path / "b")
        assert not [t for t in GENAI_OVERVIEW if t in multi], multi[:2000]
        for r in rows:
            assert (_run_name(r) in multi) == (r["devices"] >= 2), (_run_name(r), multi[:2000])

        # A sweep tracked through the server: its link is on the server itself.
        served = _track(tmp_path / "served-1", "served", rows[:4], base)
        assert served.command is None and served.url.startswith(f"{base}/#/experiments/")
        text = _page_text(served.url, tmp_path / "c")
        assert not [t for t in GENAI_OVERVIEW if t in text], text[:2000]
        assert "served-1" in text and "5 matching runs" in text, text[:2000]
    finally:
        stop(ui)
