"""The report names both FLOPs figures when the workload's stated one and torch's count differ by
more than 10% (report.diagnose.flops_notes, in the efficiency section)."""

import pytest
from report_rows import conform, row

from amdahl.report import report_from_rows
from amdahl.report.diagnose import FLOPS_DISAGREE
from amdahl.report.render_text import to_markdown

#: The D2L MLP: the 6 x MACs it used to state, and what torch executes.
STATED, COUNTED = 984_576.0, 722_432.0


def _markdown(**flops) -> str:
    rows = [row(1, batch=b, throughput=1000.0, **flops) for b in (64, 128)]
    return to_markdown(report_from_rows(conform(rows)))


def _flops_lines(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if "FLOPs per sample (" in line]


def test_a_stated_figure_far_from_the_count_is_named_once_with_both():
    text = _markdown(
        flops_counted=COUNTED, flops_stated=STATED, flops_source="counted", flops_per_sample=COUNTED
    )
    [line] = _flops_lines(text)  # one line per model, not per configuration
    assert "states 984,576" in line and "counts 722,432" in line
    assert "1.36x the count" in line and "MFU uses the counted figure" in line
    assert text.index(line) > text.index("Hardware efficiency")


def test_an_override_says_mfu_uses_the_stated_figure():
    text = _markdown(
        flops_counted=COUNTED, flops_stated=STATED, flops_source="stated", flops_per_sample=STATED
    )
    [line] = _flops_lines(text)
    assert "MFU uses the stated figure (the workload's flops_override)" in line


@pytest.mark.parametrize(
    "flops",
    [
        {"flops_counted": COUNTED, "flops_stated": COUNTED * (1 + FLOPS_DISAGREE * 0.9)},
        {"flops_counted": COUNTED},  # nothing stated
        {"flops_per_sample": STATED},  # a table from before FLOPs were counted
    ],
)
def test_no_line_within_ten_percent_or_without_both_figures(flops):
    assert _flops_lines(_markdown(**flops)) == []
    assert FLOPS_DISAGREE == 0.10


def test_hfu_sits_beside_mfu_where_the_kernels_recompute(tmp_path):
    from report_rows import row, write_sweep

    from amdahl.report import write_reports

    rows = [
        row(1, throughput=1000.0, achieved_flops=1e12, peak_flops=1e13, hfu=0.12),
        row(2, throughput=1800.0, achieved_flops=1.8e12, peak_flops=1e13, flops_source="counted"),
        row(4, throughput=3000.0, achieved_flops=3e12, peak_flops=1e13, flops_source="stated"),
    ]
    paths = write_reports(write_sweep(tmp_path / "sweep", rows))
    text = paths["markdown"].read_text()
    table = text[text.index("| configuration | achieved GFLOP/s | MFU | HFU |") :]
    assert "| 12.0% |" in table.split("\n\n")[0]  # the recomputing configuration's HFU
    lines = table.split("\n\n")[0].splitlines()
    assert "| = MFU |" in next(x for x in lines if x.startswith("| d2 "))  # counted: none redone
    assert "| n/a |" in next(x for x in lines if x.startswith("| d4 "))  # stated: unknown
