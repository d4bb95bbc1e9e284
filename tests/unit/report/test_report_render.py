"""What a user reads: report.md and report.html written into the sweep directory, the terminal
view (recommendation first), the CLI over one or two sweeps, and graceful degradation."""

import io
import re
from pathlib import Path

import pyarrow.parquet as pq
from click.testing import CliRunner
from report_rows import PARAMS, row, scaling_rows, write_sweep
from rich.console import Console

from amdahl.cli.commands import main
from amdahl.report import build_report, write_reports
from amdahl.report.render_text import print_report
from amdahl.sweepdir.layout import RESULTS_FILE

CALIBRATION = {
    "alpha_s": 50e-6,
    "bandwidth_Bps": 1e9,
    "devices": 2,
    "backend": "gloo",
    "grad_bytes_by_params": {PARAMS: 4e6},
    "peak_flops": {"fp32": 1e10},
    "peak_source": "measured: test",
}
PLOTS = ("pareto", "throughput-0", "efficiency", "breakdown", "memory")


def _terminal(sweep_dir: Path, full: bool = False) -> str:
    """The terminal view as `platform report` prints it (`print_report`), without colour;
    `full`: every section (`platform report --all`)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=140, color_system=None, force_terminal=False)
    print_report(build_report(sweep_dir), console, full=full)
    return buffer.getvalue()


def _rows():
    rows = scaling_rows()
    for i, r in enumerate(rows):
        r.update(peak_mem_bytes=(1 + i) * 2**20, achieved_flops=r["throughput"] * 1e6)
        r.update(val_accuracy=0.7, val_loss=0.5)
    rows.append(row(1, 256, throughput=1500.0, peak_mem_bytes=9 * 2**20))
    rows.append({**row(1, 512), "status": "oom", "error": "oom: out of memory", "throughput": None})
    return rows


def test_write_reports_puts_markdown_and_html_in_the_sweep_directory(tmp_path):
    d = write_sweep(tmp_path / "s", _rows(), CALIBRATION, {"report": {"cost_per_device_hour": 2.5}})
    paths = write_reports(d)
    assert paths == {"markdown": d / "report.md", "html": d / "report.html"}
    md = paths["markdown"].read_text()
    # scaling mode stated, recommendation first, then the evidence
    assert "weak scaling" in md
    order = [
        md.index(h)
        for h in (
            "## Recommendation",
            "## Speedup against ideal",
            "## Where the time went",
            "## Communication",
        )
    ]
    assert order == sorted(order)
    assert "cost per million samples" in md  # spec.yaml's price was read
    assert "PROJECTION from the Amdahl fit, not measured" in md
    assert "Ring all-reduce" in md and "alpha = 50.0 us" in md
    assert "## Thresholds used" in md and ">= 20% of the step" in md
    assert "largest batch that fit 256/device; 512/device ran out of memory" in md
    assert "| d1 b512 fp32 eager w1 ddp | oom | 1 | oom: out of memory |" in md


def test_html_is_self_contained_with_every_plot_drawn(tmp_path):
    d = write_sweep(tmp_path / "s", _rows(), CALIBRATION)
    html = write_reports(d)["html"].read_text()
    # Inline script only (the overview's sort and filter): nothing loaded or fetched.
    assert not re.search(r"<script[^>]*\bsrc\b", html, re.I)
    assert "fetch(" not in html and "XMLHttpRequest" not in html and "import(" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "url(" not in html and "@import" not in html
    svgs = re.findall(r'<svg class="plot" data-plot="([^"]+)".*?</svg>', html, re.S)
    assert set(PLOTS) <= set(svgs)
    for body in re.findall(r'<svg class="plot".*?</svg>', html, re.S):
        assert 'class="data"' in body  # every plot has drawn marks
    assert "linear ideal" in html and "no-comm ceiling" in html
    assert "PROJECTION (Amdahl fit)" in html


def test_terminal_view_puts_the_recommendation_first(tmp_path):
    d = write_sweep(tmp_path / "s", _rows())
    text = _terminal(d)
    assert text.index("Recommendation") < text.index("Scaling of the best")
    assert "Fastest: d4 b128 fp32 eager w1 ddp at 2,000 samples/s." in text
    full = _terminal(d, full=True)
    assert full.index("Recommendation") < full.index("Speedup against ideal")
    assert "no calibration.json" in full.lower()


def test_cli_report_over_two_sweeps_writes_both_and_compares(tmp_path):
    a = write_sweep(tmp_path / "a", scaling_rows())
    faster = [dict(r, throughput=r["throughput"] * 1.5) for r in scaling_rows()]
    b = write_sweep(tmp_path / "b", faster)
    result = CliRunner().invoke(main, ["report", str(a), str(b)])
    assert result.exit_code == 0, result.output
    for d in (a, b):
        assert (d / "report.md").exists() and (d / "report.html").exists()
    assert "Side by side: a vs b" in result.output
    assert "1.50x" in result.output


def test_cli_report_on_a_missing_directory_is_one_message_and_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "not a sweep directory" in result.output
    assert "Traceback" not in result.output


def test_old_or_sparse_tables_degrade_gracefully(tmp_path):
    rows = [
        {
            "sweep": "t",
            "devices": p,
            "batch_size": 64,
            "sync": "ddp",
            "status": "ok",
            "throughput": 100.0 * p**0.5,
        }
        for p in (1, 2)
    ]
    d = write_sweep(tmp_path / "s", rows)
    table = pq.read_table(d / RESULTS_FILE).drop_columns(["scaling", "peak_mem_bytes", "forward_s"])
    pq.write_table(table, d / RESULTS_FILE)
    (d / "calibration.json").write_text("{broken")
    paths = write_reports(d)
    md = paths["markdown"].read_text()
    assert "calibration.json ignored" in md
    assert "1.41x" in md  # speedup still computed from throughput alone
    assert "no step time recorded" in md
    html = paths["html"].read_text()
    assert 'data-plot="breakdown"' not in html and 'data-plot="memory"' not in html


def test_strong_scaling_is_stated(tmp_path):
    rows = [
        row(p, 512 // p, throughput=512 / t, wall=t, scaling="strong")
        for p, t in ((1, 0.1), (2, 0.06))
    ]
    md = write_reports(write_sweep(tmp_path / "s", rows))["markdown"].read_text()
    assert "strong scaling (fixed global batch" in md and "T(1) / T(p)" in md
    assert "gb512" in md


def test_an_empty_sweep_directory_reports_nothing_to_scale(tmp_path):
    text = _terminal(tmp_path)
    assert "0 result rows" in text and "No configuration can be recommended" in text


def test_time_to_target_section_ranks_configurations_and_marks_misses(tmp_path):
    goal = {"target": "val_accuracy>=0.9"}
    rows = [
        row(1, 128, throughput=1000.0, steps_to_target=400, time_to_target_s=60.0, **goal),
        row(1, 512, throughput=2500.0, steps_to_target=200, time_to_target_s=45.0, **goal),
        row(2, 128, throughput=1800.0, **goal),  # never reached within max_steps
    ]
    md = write_reports(write_sweep(tmp_path / "s", rows))["markdown"].read_text()
    section = md[md.index("## Time to target") :]
    assert "val_accuracy>=0.9" in section
    lines = [ln for ln in section.splitlines() if ln.startswith("| d")]
    assert lines[0].startswith("| d1 b512") and "| 45.00 |" in lines[0]
    assert "| 102,400 |" in lines[0]  # samples = 200 steps x 512
    assert lines[1].startswith("| d1 b128") and "| 60.00 |" in lines[1]
    assert lines[2].startswith("| d2 b128") and "| missed |" in lines[2] and "| 0/1 |" in lines[2]
    plain = write_reports(write_sweep(tmp_path / "p", [row(1, 128)]))["markdown"].read_text()
    assert "## Time to target" not in plain
