"""report.md shows the user's text as text: sweep names, parameters, labels and error messages
may hold Markdown syntax (emphasis, links, raw HTML, code spans, table pipes), which must come
out literally when the file is rendered, not as formatting, links or markup."""

import html as htmllib
import json
import re

from markdown_it import MarkdownIt
from report_rows import row, write_sweep

from amdahl.report import write_reports
from amdahl.report.render_text import md_block, md_escape

ERROR = (
    "RuntimeError: *boom* at [x](http://evil.example) <script>alert(1)</script> `rm` a|b \\ ~~s~~"
)
ACTS = ("*relu*", "_gelu_ <b>x</b>")


def _rendered(markdown: str) -> str:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(markdown)


def test_user_text_in_report_md_renders_as_text(tmp_path):
    rows = [
        row(1, 128, params=json.dumps({"act": ACTS[0]})),
        row(1, 128, params=json.dumps({"act": ACTS[1]}), throughput=900.0),
        {**row(1, 512), "status": "failed", "error": ERROR + "\nsecond line", "throughput": None},
    ]
    d = write_sweep(tmp_path / "t_*x*_[y](z)", rows)
    html = _rendered(write_reports(d)["markdown"].read_text())
    text = htmllib.unescape(re.sub(r"<[^>]+>", "", html))  # what a reader sees
    assert "<em>" not in html and "<a " not in html and "<script" not in html
    assert "<del>" not in html and "<code>" not in html and "<b>" not in html
    assert "Sweep t_*x*_[y](z)" in text
    assert 'act="*relu*"' in text and 'act="_gelu_ <b>x</b>"' in text
    assert ERROR in text  # the failure's reason, pipe and backslash included, in its cell


def test_text_opening_a_block_stays_a_paragraph():
    for text in ("- not a list", "> not a quote", "1. not a numbered list", "# not a heading"):
        assert htmllib.unescape(_rendered(md_block(text))) == f"<p>{text}</p>\n"
    assert md_block("1.5x faster") == "1.5x faster"  # nothing to escape: left readable
    assert md_escape("val_accuracy>=0.9 in 12 steps") == "val_accuracy>=0.9 in 12 steps"
