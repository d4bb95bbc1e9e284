"""A report that reads at any size (issue 24): on a 128-configuration sweep the terminal view
fits on a screen and names what it left out, the families are ranked by the sweep's objective
(checked against a ranking computed here from the raw rows), report.md keeps every row in that
order, report.html folds the families away but the best, and labels name every varying axis the
same way for every configuration."""

import io
import re
from collections import defaultdict

from big_sweep_rows import BATCHES, PRECISIONS, PREFETCH, SYNCS, big_sweep_rows
from click.testing import CliRunner
from report_rows import row, scaling_rows, write_sweep
from rich.console import Console

from amdahl.analysis.configs import group_configs
from amdahl.cli.commands import main
from amdahl.report import build_report, report_from_rows, write_reports
from amdahl.report.render_text import print_report

WIDTH = 120
FAMILIES = len(BATCHES) * len(PRECISIONS) * len(SYNCS) * len(PREFETCH)


def _terminal(report, width=WIDTH) -> str:
    """The short view `platform report` prints, without colour."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False)
    print_report(report, console)
    return buffer.getvalue()


def _expected_ranking(rows) -> list[str]:
    """Families best first, from the rows alone: a family's value is its best ok throughput
    over the configurations that may be recommended (sync none only on one device); families
    with no ok run last."""
    best: dict[str, float] = {}
    for r in rows:
        label = f"b{r['batch_size']} {r['precision']} eager w1 {r['sync']} p{r['prefetch_batches']}"
        best.setdefault(label, float("-inf"))
        if r["status"] == "ok" and (r["sync"] != "none" or r["devices"] == 1):
            best[label] = max(best[label], r["throughput"])
    return sorted(best, key=lambda k: -best[k])


def test_the_terminal_view_of_128_configurations_fits_a_screen_and_names_what_it_left_out(
    tmp_path,
):
    d = write_sweep(tmp_path / "big", big_sweep_rows())
    report = build_report(d)
    assert len(report.configs) == 128
    text = _terminal(report)
    lines = text.splitlines()
    assert len(lines) <= 60, f"{len(lines)} lines"
    # The answer leads, then the top configurations, then the best one's scaling.
    order = [text.index(s) for s in ("Recommendation", "Top 10 of 64", "Scaling of the best")]
    assert order == sorted(order)
    assert "Fastest: d2 b256 fp32 eager w1 local_sgd p4" in text
    # What it left out, and where it is.
    left = text[text.index("Not shown here") :]
    assert "Overview: 54 more configurations" in left
    assert "Where the time went (126 rows)" in left
    assert f"{d / 'report.md'}" in left.replace("\n", "")
    assert f"platform report --all {d}" in left.replace("\n", "")
    for title in ("Hardware efficiency and memory", "Training quality", "Thresholds used"):
        assert title in left


def test_platform_report_prints_the_short_view_and_everything_with_all(tmp_path):
    """`platform report --all` prints every section (what the short view names as left out)."""
    d = write_sweep(tmp_path / "big", big_sweep_rows())
    short = CliRunner().invoke(main, ["report", str(d)], env={"COLUMNS": str(WIDTH)})
    assert short.exit_code == 0, short.output
    everything = CliRunner().invoke(main, ["report", "--all", str(d)], env={"COLUMNS": str(WIDTH)})
    assert everything.exit_code == 0, everything.output
    assert "Not shown here" in short.output and "Not shown here" not in everything.output
    assert "## " not in everything.output and "Where the time went" in everything.output
    assert len(short.output.splitlines()) < 70 < 1000 < len(everything.output.splitlines())


def test_families_rank_by_best_recommendable_throughput_in_every_output(tmp_path):
    rows = big_sweep_rows()
    expected = _expected_ranking(rows)
    report = report_from_rows(rows)
    assert [f.label for f in report.ranking.families] == expected
    assert expected[-1] == "b256 bf16 eager w1 ddp_bf16 p1"  # out of memory on both counts
    # sync none on 2 devices is the ceiling, not a pick: its family ranks on its 1-device run.
    none = next(f for f in report.ranking.families if f.label == "b256 fp32 eager w1 none p4")
    assert none.best.devices == 1 and none.at(2).throughput.median > none.value

    md = write_reports(write_sweep(tmp_path / "big", rows))["markdown"].read_text()
    overview = md[md.index("## Overview") : md.index("## Recommendation")]
    ranked = re.findall(r"^\| (\d+) \| ([^|]+?) \|", overview, re.M)
    assert [int(n) for n, _ in ranked] == list(range(1, FAMILIES + 1))  # complete
    assert [label for _, label in ranked] == expected
    assert "| d1 oom; d2 oom |" in overview
    # The scaling tables follow the same order (the failed family has no curve).
    scaling = md[md.index("## Speedup against ideal") : md.index("## Where the time went")]
    titles = re.findall(r"^\*\*(.+?)\*\*$", scaling, re.M)
    assert titles == expected[:-1]
    # So does the per-configuration breakdown: best family first, by device count.
    breakdown = md[md.index("## Where the time went") :]
    first = re.findall(r"^\| (d\d [^|]+?) \|", breakdown, re.M)[:2]
    assert first == [f"d1 {expected[0]}", f"d2 {expected[0]}"]


def test_the_ranking_follows_the_spec_objective(tmp_path):
    rows = big_sweep_rows()
    spec = {"search": {"objective": "throughput_per_device"}}
    report = build_report(write_sweep(tmp_path / "s", rows, spec=spec))
    assert report.ranking.objective == "throughput_per_device"
    top = report.ranking.families[0]
    per_device = max(
        r["throughput"] / r["devices"]
        for r in rows
        if r["status"] == "ok" and (r["sync"] != "none" or r["devices"] == 1)
    )
    assert top.value == per_device and top.best.devices == 1
    assert "by throughput per device" in _terminal(report)

    # A time-to-target sweep ranks by the shortest time, fastest first.
    goal = {"target": "val_accuracy>=0.9"}
    ttt = [
        row(1, 128, throughput=1000.0, time_to_target_s=60.0, **goal),
        row(1, 512, throughput=2500.0, time_to_target_s=45.0, **goal),
        row(1, 256, throughput=3000.0, **goal),  # never reached the target
    ]
    report = report_from_rows(ttt)
    assert report.ranking.objective == "time_to_target"
    assert [f.label.split()[0] for f in report.ranking.families] == ["b512", "b128", "b256"]


def test_report_html_folds_every_family_but_the_best(tmp_path):
    html = write_reports(write_sweep(tmp_path / "big", big_sweep_rows()))["html"].read_text()
    scaling = html[html.index('id="scaling"') : html.index('id="breakdown"')]
    folds = re.findall(r"<details( open)?><summary><b>#(\d+)</b> ([^:<]+)", scaling)
    assert len(folds) == FAMILIES - 1  # one per curve
    assert [bool(o) for o, _, _ in folds] == [True] + [False] * (FAMILIES - 2)
    assert folds[0][1:] == ("1", "b256 fp32 eager w1 local_sgd p4")
    # The overview opens the page: every family, one row each, before the recommendation.
    assert html.index('id="overview"') < html.index('id="recommendation"')
    body = html[html.index('<table id="overview-table"') :]
    body = body[: body.index("</table>")]
    assert body.count("<tr") == FAMILIES + 1
    assert body.count('<svg class="spark"') == FAMILIES - 1  # no curve without an ok run


def test_labels_name_every_varying_axis_the_same_way():
    labels = [c.label for c in group_configs(big_sweep_rows())]
    assert len(set(labels)) == 128
    assert {len(label.split()) for label in labels} == {7}
    assert all(re.fullmatch(r"d\d b\d+ (fp32|bf16) eager w1 \w+ p[14]", lb) for lb in labels)

    # One non-default value anywhere: every label names that axis, the default included.
    rows = scaling_rows()
    rows[0] = {**rows[0], "input": "torch_loader"}
    labels = [c.label for c in group_configs(rows)]
    assert sorted(lb.split()[6] for lb in labels) == ["ray_data"] * 5 + ["torch_loader"]
    # Everything at its default (or from a table without the columns): unsaid, as before.
    assert [c.label for c in group_configs(scaling_rows())][0] == "d1 b128 fp32 eager w1 ddp"
    # One value for the whole sweep, not the default: named on every label.
    only_p1 = [{**r, "prefetch_batches": 1} for r in scaling_rows()]
    assert all(c.label.endswith(" p1") for c in group_configs(only_p1))


def test_a_small_report_still_says_where_the_rest_is():
    report = report_from_rows(scaling_rows())
    text = _terminal(report)
    assert "Top 2 of 2 configurations" in text
    assert "Overview:" not in text[text.index("Not shown here") :]  # nothing more to rank
    assert "print_report(full=True)" in text  # no sweep directory: the Python API's way
    groups = defaultdict(list)
    for f in report.ranking.families:
        groups[f.eligible].append(f.label)
    assert groups[True][0] == "b128 fp32 eager w1 ddp"
