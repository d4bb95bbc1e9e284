"""The CLI's live progress table, plan table and closing summary (amdahl.cli.progress): what each
shows, and error text and labels shown as text, never read as rich markup (an error holding
"[/data]" used to raise MarkupError in the refresh thread, and "shape [batch, 784]" was blanked
as an unknown tag)."""

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from amdahl.cli import progress
from amdahl.driver.events import LaunchStarted, Planned, RungStarted, TrialDone
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import Node
from amdahl.spec.load import validate_spec

ERROR = "RuntimeError: cannot open [/data] for shape [batch, 784]\nsecond line"


@pytest.fixture
def out(monkeypatch) -> io.StringIO:
    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None, force_terminal=False)
    monkeypatch.setattr(progress, "console", console)
    return buf


def _plan(tag: str = "[/x] [batch, 784]"):
    """Two trials; the first's label names `tag` (a label names the parameters that vary)."""
    spec = validate_spec(
        {"name": "t", "workload": "mlp", "grid": {"devices": [1], "params.tag": [tag, "b"]}}
    )
    return plan_sweep(spec, [Node(cpus=4)], WorkloadFacts({}))


def _text(renderable) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None, force_terminal=False).print(renderable)
    return buf.getvalue()


def test_an_error_with_brackets_is_shown_as_text(out, tmp_path):
    plan = _plan()
    trial = plan.trials[0]
    with progress.LiveProgress() as live:
        live.event(Planned(plan, tmp_path / "[run]"))
        live.event(LaunchStarted(SimpleNamespace(trials=[trial])))
        row = {"trial_id": trial.trial_id, "repeat": 0, "status": "failed", "error": ERROR}
        live.event(TrialDone({**row, "throughput": None}))
        text = _text(live._table())
    assert "cannot open [/data] for shape [batch, 784]" in text
    assert "second line" not in text  # the note is the error's first line
    assert 'tag="[/x] [batch, 784]"' in text  # the label
    assert "failed" in text and "[run]" in text
    assert "[/data]" in out.getvalue()  # the live display itself rendered it


def test_the_plan_table_shows_labels_and_names_as_text(out):
    progress.print_plan(_plan("[red]x[/red] [/y]"))
    assert 'tag="[red]x[/red] [/y]"' in out.getvalue()


def test_the_outcome_prints_paths_with_brackets(out, tmp_path):
    sweep_dir = Path(tmp_path / "[" / "w]")  # the path holds "[/w]"
    sweep_dir.mkdir(parents=True)
    outcome = SimpleNamespace(
        rows=[], wall_s=1.0, sweep_dir=sweep_dir, failed=[], search=None, group_starts=0
    )
    progress.print_outcome(outcome)
    assert f"results: {sweep_dir}/results.parquet" in out.getvalue()
    assert "calibration" not in out.getvalue()  # none measured, none reused


def test_the_outcome_says_whether_the_calibration_was_measured_or_reused(out, tmp_path):
    common = {"rows": [], "wall_s": 9.0, "sweep_dir": tmp_path, "failed": [], "search": None}
    common |= {"group_start_reasons": [], "first_measured_s": None}
    progress.print_outcome(SimpleNamespace(**common, group_starts=1, calibration_s=6.5))
    assert "calibration: measured in 6.5 s; later sweeps on this cluster shape" in out.getvalue()
    out.seek(0)
    out.truncate(0)
    outcome = SimpleNamespace(**common, group_starts=1, calibration_reused_from="/runs/a-1")
    progress.print_outcome(outcome)
    text = out.getvalue()
    assert "calibration: reused from /runs/a-1" in text and "--recalibrate" in text


# --------------------------------------------------------------------------- what it shows


def _two_trials():
    spec = validate_spec({"name": "t", "workload": "mlp", "grid": {"devices": [1, 64]}})
    return plan_sweep(spec, [Node(cpus=2)], WorkloadFacts({}))


def test_the_table_follows_each_trial_from_pending_to_its_result(out, tmp_path):
    spec = validate_spec({"name": "t", "workload": "mlp", "grid": {"batch_size": [32, 64, 128]}})
    plan = plan_sweep(spec, [Node(cpus=2)], WorkloadFacts({}))
    first, second, third = plan.trials
    with progress.LiveProgress() as live:
        finished = {(first.trial_id, 0)}  # from the run this one resumes
        live.event(Planned(plan, tmp_path, finished))
        statuses = lambda: [live.rows[f"{t.trial_id}:0"]["status"] for t in plan.trials]  # noqa: E731
        assert statuses() == ["earlier", "pending", "pending"]
        live.event(LaunchStarted(SimpleNamespace(trials=[second, third])))
        assert statuses() == ["earlier", "running", "running"]
        row = {"trial_id": second.trial_id, "repeat": 0, "status": "ok", "throughput": 12345.6}
        live.event(TrialDone(row))
        assert statuses() == ["earlier", "ok", "running"]
        text = _text(live._table())
    assert "12,346" in text  # samples/s, whole numbers with separators
    assert "1 done, 1 to go" in text and "ETA" in text


def test_a_refused_trial_shows_its_reason_and_is_not_counted(out, tmp_path):
    plan = _two_trials()
    [refused] = plan.refused
    with progress.LiveProgress() as live:
        live.event(Planned(plan, tmp_path))
        text = _text(live._table())
    assert live.rows[f"{refused.trial_id}:0"]["status"] == "refused"
    assert refused.refused[:40] in text
    assert "0 done, 1 to go" in text and "ETA" not in text  # nothing done: no estimate yet


def test_the_plan_table_lists_what_will_not_run_with_the_reason(out):
    plan = _two_trials()
    progress.print_plan(plan)
    text = out.getvalue()
    assert "1 of 2 trials will run in 1 launches" in text
    assert "cluster: node 2 CPU 0 GPU" in text
    assert plan.resource_note and plan.resource_note in text  # what `resources: auto` chose
    [refused] = plan.refused
    assert (
        f"will not run:\n  {refused.trial_id} {plan.labels[refused.trial_id]}: {refused.refused}"
        in text
    )


def test_the_outcome_sums_up_time_inside_and_outside_measured_steps(out, tmp_path):
    (tmp_path / "report.html").write_text("<html/>")
    rows = [
        {"trial_id": "a", "status": "ok", "measured_s": 4.0},
        {"trial_id": "b", "status": "failed", "error": "boom"},
    ]
    failed = rows[1:]
    progress.print_outcome(
        SimpleNamespace(
            rows=rows,
            wall_s=10.0,
            sweep_dir=tmp_path,
            failed=failed,
            search=None,
            group_starts=1,
            first_measured_s=6.25,
        )
    )
    text = out.getvalue()
    assert "1 of 2 trial runs ok in 10.0 s (4.0 s inside measured steps, 3.0 s per trial" in text
    assert "1 worker group started; first measured step 6.2 s after the start." in text
    assert f"report:  {tmp_path / 'report.html'} (and report.md)" in text
    assert "1 trial runs did not succeed" in text

    # more than one start: why each, counted
    out.seek(0)
    out.seek(0)
    out.truncate(0)
    again = "again for the calibration: closed while idle, to free resources for another shape"
    progress.print_outcome(
        SimpleNamespace(
            rows=rows,
            wall_s=10.0,
            sweep_dir=tmp_path,
            failed=failed,
            search=None,
            group_starts=3,
            group_start_reasons=["first start of a shape"] * 2 + [again],
            first_measured_s=None,
        )
    )
    assert f"3 worker groups started (2 x first start of a shape; 1 x {again})." in out.getvalue()


def test_a_halving_search_ends_with_its_pick_and_the_finalists_it_cannot_separate(out, tmp_path):
    from amdahl.search.halving import replay

    spec = validate_spec(
        {
            "name": "t",
            "workload": "mlp",
            "train": {"steps": 20},
            "grid": {"batch_size": [32, 64, 128]},
            "search": {"method": "halving", "min_steps": 10, "eta": 2, "final_repeats": 2},
        }
    )
    plan = plan_sweep(spec, [Node(cpus=2)], WorkloadFacts({}))
    a, b, c = (t.trial_id for t in plan.trials)

    def row(tid, rung, throughput, repeat=0):
        return {
            "trial_id": tid,
            "repeat": repeat,
            "rung": rung,
            "status": "ok",
            "throughput": throughput,
            "steps": 10 * (rung + 1),
            "devices": 1,
        }

    rows = [row(a, 0, 900.0), row(b, 0, 1000.0), row(c, 0, 100.0)]
    rows += [row(a, 1, 950.0), row(a, 1, 1010.0, 1), row(b, 1, 1000.0), row(b, 1, 1040.0, 1)]
    rows[3]["continued_from"] = f"{a}/0/0"  # b's first run started again, saying why
    rows[5]["restart_reason"] = f"{b}/0/0: not kept in this worker group (started after it ran)"
    with progress.LiveProgress() as live:
        live.event(Planned(plan, tmp_path))
        live.event(RungStarted(rung=1, rungs=2, steps=20, configurations={a, b}))
        for r in rows:
            live.event(TrialDone(r))
        text = _text(live._table())
    # The title says which rung runs, not counts and an ETA that a search cannot know.
    assert "search rung 1 of 2: 2 configurations for 20 steps" in text
    assert "to go" not in text and "ETA" not in text
    # The last rung's second run of each finalist gets its own line, after its first.
    assert live.order.index(f"{b}:1") == live.order.index(f"{b}:0") + 1
    assert "r1" in live.rows[f"{b}:1"]["label"] and "1,040" in text
    state = replay(rows, spec.search, spec.train)
    progress.print_outcome(
        SimpleNamespace(
            rows=rows,
            wall_s=9.0,
            sweep_dir=tmp_path,
            failed=[],
            search=state,
            plan=plan,
            group_starts=0,
        )
    )
    labels = plan.labels
    text = out.getvalue()
    assert f"search: best {labels[b]}: 1,020 samples/s (median of 2 runs: 1,000 to 1,040)" in text
    assert f"not measurably different from it (their ranges overlap): {labels[a]}" in text
    assert "one run per finalist" not in text
    # rung 0 cut c on one run per configuration: said, with how to measure the noise between runs
    assert "the rungs' cuts saw one run per configuration" in text
    assert "train.repeats: 2 measures it" in text
    assert "rungs continued: 1 of 2 promoted runs went on from the rung before" in text
    assert "1 started again (first: " in text and "not kept in this worker group" in text

    # One run each: the summary says the noise between runs is not measured, and how far
    # behind the runner-up is.
    single = validate_spec(
        {**spec.model_dump(), "search": {**spec.search.model_dump(), "final_repeats": 1}}
    )
    once = [r for r in rows if r["repeat"] == 0]
    state = replay(once, single.search, single.train)
    out.seek(0)
    out.seek(0)
    out.truncate(0)
    progress.print_outcome(
        SimpleNamespace(
            rows=once,
            wall_s=9.0,
            sweep_dir=tmp_path,
            failed=[],
            search=state,
            plan=plan,
            group_starts=0,
        )
    )
    text = out.getvalue()
    assert f"search: best {labels[b]}: 1,000 samples/s\n" in text
    assert f"the runner-up, {labels[a]}, is 5.0% below); search.final_repeats: 3" in text


def test_the_outcome_lines_stay_whole_in_a_narrow_log(monkeypatch, tmp_path):
    """Piped into a log or CI (no terminal: rich assumes 80 columns), every summary line is one
    line: sentences and paths are not broken where a reader greps or copies them."""
    buf = io.StringIO()
    monkeypatch.setattr(
        progress, "console", Console(file=buf, width=80, color_system=None, force_terminal=False)
    )
    sweep_dir = tmp_path / ("a-sweep-directory-with-a-long-name-" * 2)
    sweep_dir.mkdir()
    (sweep_dir / "report.html").write_text("<html/>")
    rows = [{"trial_id": "a", "status": "ok", "measured_s": 53.5}, {"trial_id": "b"}]
    rows[1] |= {"status": "failed", "error": "boom"}
    progress.print_outcome(
        SimpleNamespace(
            rows=rows,
            wall_s=105.5,
            sweep_dir=sweep_dir,
            failed=rows[1:],
            search=None,
            group_starts=1,
            first_measured_s=41.4,
        )
    )
    lines = buf.getvalue().splitlines()
    assert (
        "1 of 2 trial runs ok in 105.5 s (53.5 s inside measured steps, 26.0 s per trial "
        "outside them)." in lines
    )
    assert "1 worker group started; first measured step 41.4 s after the start." in lines
    assert f"results: {sweep_dir}/results.parquet" in lines
    assert (
        f"report:  {sweep_dir}/report.html (and report.md); terminal view: platform report "
        f"{sweep_dir}" in lines
    )
    assert (
        "1 trial runs did not succeed; reasons are in the results table and `platform report`."
        in lines
    )


def test_a_long_reason_is_wrapped_whole_not_cut(out, tmp_path):
    """The reason's first line ends with where in the user's code it failed: a narrow terminal
    wraps it rather than cutting it mid-word (issue 53: "...size and s")."""
    plan = _plan()
    trial = plan.trials[0]
    reason = "failed: RuntimeError: " + "word " * 30 + "(at model.py:187 in forward)"
    with progress.LiveProgress() as live:
        live.event(Planned(plan, tmp_path / "run"))
        live.event(LaunchStarted(SimpleNamespace(trials=[trial])))
        row = {"trial_id": trial.trial_id, "repeat": 0, "status": "failed", "error": reason}
        live.event(TrialDone({**row, "throughput": None}))
        buf = io.StringIO()
        Console(file=buf, width=100, color_system=None).print(live._table())
    text = " ".join(buf.getvalue().replace("│", " ").split())
    assert "(at model.py:187 in forward)" in text
