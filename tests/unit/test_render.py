"""The CLI's live progress table and plan table: error text and labels are shown as text, never
read as rich markup (an error holding "[/data]" used to raise MarkupError in the refresh thread,
and "shape [batch, 784]" was blanked as an unknown tag)."""

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from amdahl import render
from amdahl.plan import Node, plan_sweep
from amdahl.spec import validate_spec

ERROR = "RuntimeError: cannot open [/data] for shape [batch, 784]\nsecond line"


@pytest.fixture
def out(monkeypatch) -> io.StringIO:
    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None, force_terminal=False)
    monkeypatch.setattr(render, "console", console)
    return buf


def _plan(tag: str = "[/x] [batch, 784]"):
    spec = validate_spec(
        {"name": "t", "workload": "mlp", "grid": {"devices": [1], "params.tag": [tag]}}
    )
    return plan_sweep(spec, [Node(cpus=4)], {})


def _text(renderable) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None, force_terminal=False).print(renderable)
    return buf.getvalue()


def test_an_error_with_brackets_is_shown_as_text(out, tmp_path):
    plan = _plan()
    trial = plan.trials[0]
    with render.LiveProgress() as progress:
        progress.event("planned", {"plan": plan, "sweep_dir": tmp_path / "[run]"})
        progress.event("launch_started", {"launch": SimpleNamespace(trials=[trial])})
        row = {"trial_id": trial.trial_id, "repeat": 0, "status": "failed", "error": ERROR}
        progress.event("trial_done", {"row": {**row, "throughput": None}})
        text = _text(progress._table())
    assert "cannot open [/data] for shape [batch, 784]" in text
    assert "second line" not in text  # the note is the error's first line
    assert "tag=[/x] [batch, 784]" in text  # the label
    assert "failed" in text and "[run]" in text
    assert "[/data]" in out.getvalue()  # the live display itself rendered it


def test_the_plan_table_shows_labels_and_names_as_text(out):
    render.print_plan(_plan("[red]x[/red] [/y]"))
    assert "tag=[red]x[/red] [/y]" in out.getvalue()


def test_the_outcome_prints_paths_with_brackets(out, tmp_path):
    sweep_dir = Path(tmp_path / "[" / "w]")  # the path holds "[/w]"
    sweep_dir.mkdir(parents=True)
    outcome = SimpleNamespace(rows=[], wall_s=1.0, sweep_dir=sweep_dir, failed=[])
    render.print_outcome(outcome)
    assert f"results: {sweep_dir}/results.parquet" in out.getvalue()
