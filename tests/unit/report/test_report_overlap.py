"""The profiler traces' figures in the report: overlap beside exposed communication (the
Communication table), the communication advice the overlap points to, and the straggler note
with its threshold. Rows as scaling_rows builds them (d4 ddp: 33% exposed communication), with
the trace columns set by hand."""

from __future__ import annotations

import pytest
from report_rows import conform, scaling_rows

from amdahl.report import report_from_rows
from amdahl.report.bottleneck import THRESHOLD_TEXT
from amdahl.report.model_sections import communication_section

D4 = "d4 b128 fp32 eager w1 ddp"


def _report(**trace_columns):
    rows = scaling_rows()
    for r in rows:
        if r["devices"] == 4 and r["sync"] == "ddp":
            r.update(trace_columns)
    report = report_from_rows(conform(rows))
    return report, next(d for d in report.diagnoses if d.config.label == D4)


def test_low_overlap_says_the_all_reduce_is_not_hidden():
    _, d = _report(comm_overlap=0.2, comm_trace_s=0.1)
    assert d.bottleneck == "communication"
    assert "20% of the traced all-reduce overlapped" in d.evidence
    assert d.advice[0].startswith("all-reduce not hidden (20%")
    assert "bucket_cap_mb" in d.advice[0]


def test_high_overlap_says_it_is_hidden_and_drops_bucket_tuning():
    _, d = _report(comm_overlap=0.9, comm_trace_s=0.1)
    assert d.advice[0].startswith("all-reduce already hidden (90%")
    assert not any("bucket_cap_mb" in tip for tip in d.advice)


def test_without_traces_the_advice_is_as_before():
    _, d = _report()
    assert d.overlap is None and "traced" not in d.evidence
    assert any("bucket_cap_mb" in tip for tip in d.advice)


def test_straggler_named_above_its_threshold_only():
    # the d4 step is 0.256 s: 30 ms of waiting is 12%, 5 ms is 2% (threshold 5%)
    _, d = _report(straggler_rank=3, straggler_s=0.03)
    assert any(a.startswith("straggler: the other ranks wait 30.00 ms") for a in d.also)
    assert any("rank 3" in a for a in d.also)
    _, quiet = _report(straggler_rank=3, straggler_s=0.005)
    assert not any(a.startswith("straggler") for a in quiet.also)
    # and the report states the threshold it used
    assert any("straggler" in t and ">= 5% of the step" in t for t in THRESHOLD_TEXT)


def test_communication_table_shows_overlap_beside_exposed_communication():
    report, _ = _report(comm_overlap=0.25, comm_trace_s=0.1, straggler_rank=1, straggler_s=0.02)
    table = communication_section(report).tables[0]
    row = next(r for r in table.rows if r[0] == D4)
    cells = dict(zip(table.headers, row, strict=True))
    assert cells["measured exposed ms"] == "85.00"
    assert cells["traced comm ms"] == "100.00"
    assert cells["overlapped"] == "25%"
    assert cells["straggler"] == "rank 1 (+20.00)"


@pytest.mark.parametrize(("overlap", "hidden"), [(0.49, False), (0.5, True)])
def test_overlap_threshold_is_the_stated_one(overlap, hidden):
    _, d = _report(comm_overlap=overlap)
    assert d.advice[0].startswith("all-reduce already hidden" if hidden else "all-reduce not")
    # the threshold the report states is the one the advice used: 50%
    assert any("overlap" in t and "below 50%" in t for t in THRESHOLD_TEXT)


def test_each_ranks_trace_is_linked_from_report_md_and_html():
    from amdahl.report.render_html import to_html
    from amdahl.report.render_text import to_markdown

    report, _ = _report(comm_overlap=0.25, comm_trace_s=0.1, trace_dir="traces/abc123/0")
    files = [f"traces/abc123/0/rank{k}.pt.trace.json.gz" for k in range(4)]
    assert [path for _, path in communication_section(report).links] == files
    md, html = to_markdown(report), to_html(report)
    for k, path in enumerate(files):
        assert f"- [{D4}: rank {k} trace]({path})" in md
        assert f'<a href="{path}">{D4}: rank {k} trace</a>' in html
    assert "ui.perfetto.dev" in md and "chrome://tracing" in html
    untraced, _ = _report(comm_overlap=0.25)
    assert communication_section(untraced).links == []
    assert "ui.perfetto.dev" not in to_markdown(untraced)
