"""Tables in an 80- and a 100-column terminal (issue 34, item 8): `platform report` (its short
view and --all) and `platform predict` print every table with its headers wrapped at spaces,
never inside a word ("efficienc y", "predict ed"), and no wider than the terminal; a table that
cannot fit leaves out its last columns and names them."""

from __future__ import annotations

import dataclasses
import io

import pytest
from click.testing import CliRunner
from report_rows import row, scaling_rows, write_sweep
from rich.cells import cell_len
from rich.console import Console

from amdahl import build_report, predict_sweep
from amdahl.cli.commands import main
from amdahl.report.brief import brief_sections
from amdahl.report.document import Table
from amdahl.report.prediction_document import prediction_sections
from amdahl.report.render_text import _rich_table
from amdahl.report.sections import sections

CALIBRATION = {"alpha_s": 20e-6, "bandwidth_Bps": 1e9, "devices": 2, "backend": "gloo"}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    rows = scaling_rows() + [
        row(1, 512, "ddp", 3000.0, phases=(0.001, 0.04, 0.08, 0.007)),
        row(2, 512, "ddp", 5000.0, phases=(0.001, 0.04, 0.11, 0.007)),
        row(2, 512, "none", 5600.0, phases=(0.001, 0.04, 0.08, 0.007)),
    ]
    spec = {"report": {"cost_per_device_hour": 2.0}}
    return write_sweep(tmp_path_factory.mktemp("widths") / "s", rows, CALIBRATION, spec)


def _views(sweep_dir):
    """(view, compact, tables) as `platform report`, `report --all` and `predict` print them."""
    report = build_report(sweep_dir)
    predicted = predict_sweep(sweep_dir, [4, 8, 16], None, 1)
    return [
        ("report", True, [t for s in brief_sections(report) for t in s.tables]),
        ("report --all", False, [t for s in sections(report) for t in s.tables]),
        ("predict", False, [t for s in prediction_sections(predicted) for t in s.tables]),
    ]


def _render(t: Table, compact: bool, width: int) -> tuple[list[str], list[str], list[str]]:
    """The table's lines laid out for `width` (not cropped to it), its header lines, and the
    headers it leaves out."""
    table, left_out = _rich_table(dataclasses.replace(t, title=""), compact, width)
    buffer = io.StringIO()
    Console(file=buffer, width=1000, color_system=None).print(table, width=width)
    lines = buffer.getvalue().splitlines()
    if compact:  # headers, then a rule of ─
        rule = next(i for i, ln in enumerate(lines) if ln.strip() and set(ln.strip()) <= {"─"})
        return lines, lines[:rule], left_out
    rule = next(i for i, ln in enumerate(lines) if ln.startswith("┡"))
    return lines, lines[1:rule], left_out


@pytest.mark.parametrize("width", [80, 100])
def test_no_header_word_is_split_and_no_table_is_wider_than_the_terminal(sweep_dir, width):
    seen = 0
    for view, compact, tables in _views(sweep_dir):
        for t in tables:
            lines, head, left_out = _render(t, compact, width)
            where = f"{view}, {t.headers} at {width} columns:\n" + "\n".join(lines)
            assert max(cell_len(ln.rstrip()) for ln in lines) <= width, where
            assert set(left_out) < set(t.headers), where
            shown = [h for h in t.headers if h not in left_out]
            for word in (w for h in shown for w in h.split()):
                assert any(word in ln for ln in head), f"{word!r} split in {where}"
            seen += 1
    assert seen >= 10


def test_a_table_too_wide_leaves_out_its_last_columns_empty_first_and_says_so():
    headers = ["configuration", "devices", "measured/predicted", "note", "Karp-Flatt e"]
    t = Table(headers, [["d2 b128 fp32 eager w1 ddp", "2", "1.05", "", "0.12"]])
    _, head, left_out = _render(t, compact=False, width=60)
    assert left_out == ["note", "Karp-Flatt e"]  # the empty one first, then the last
    assert "measured/predicted" in "\n".join(head)
    assert _rich_table(t, False, 200)[1] == []  # where it fits, every column


def test_the_commands_name_what_they_left_out(sweep_dir):
    narrow = CliRunner(env={"COLUMNS": "80"})
    for args in (["report", "--all"], ["predict", "--devices", "4,8,16"]):
        result = narrow.invoke(main, [args[0], str(sweep_dir), *args[1:]])
        assert result.exit_code == 0, result.output
        assert "left out at this terminal width" in result.output
