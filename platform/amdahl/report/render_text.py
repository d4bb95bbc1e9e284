"""Terminal (rich) and Markdown renderings of the report document."""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from amdahl.report.build import Report
from amdahl.report.document import TEXT_COLUMNS, Section, Table
from amdahl.report.sections import sections


def print_sections(secs: list[Section], console: Console) -> None:
    for sec in secs:
        console.rule(f"[bold]{escape(sec.title)}")
        for p in sec.paras:
            console.print(escape(p))
        for t in sec.tables:
            console.print(_rich_table(t))
        for b in sec.bullets:
            console.print(f" - {escape(b)}")
        console.print()


def _rich_table(t: Table) -> RichTable:
    table = RichTable(title=escape(t.title) if t.title else None, title_justify="left")
    for h in t.headers:
        text = h in TEXT_COLUMNS or h.startswith("against")
        table.add_column(escape(h), justify="left" if text else "right", overflow="fold")
    for row in t.rows:
        styled = [escape(v) for v in row]
        styled = [f"[red]{v}[/]" if v == "FLAGGED" else v for v in styled]
        table.add_row(*styled)
    return table


def print_report(report: Report, console: Console) -> None:
    print_sections(sections(report), console)


def to_markdown(report: Report) -> str:
    out = []
    for i, sec in enumerate(sections(report)):
        out.append(f"{'#' if i == 0 else '##'} {md_escape(sec.title)}\n")
        for p in sec.paras:
            out.append(md_block(p) + "\n")
        for t in sec.tables:
            out.append(markdown_table(t))
        for b in sec.bullets:
            out.append(f"- {md_block(b)}")
        if sec.bullets:
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def markdown_table(t: Table) -> str:
    lines = [f"**{md_escape(t.title)}**\n"] if t.title else []
    lines.append("| " + " | ".join(md_escape(h) for h in t.headers) + " |")
    lines.append("|" + "|".join("---" for _ in t.headers) + "|")
    for row in t.rows:
        lines.append("| " + " | ".join(md_escape(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


#: What Markdown (CommonMark with GitHub's tables) reads as syntax anywhere in a line: the
#: backslash itself, code spans, emphasis, links and images, raw HTML and autolinks, table
#: cells, strikethrough, heading marks, entity references, and `_` where it can open or close
#: emphasis (not inside a word such as val_accuracy). The report's text holds sweep names,
#: parameters, labels and error messages, which are the user's or a library's text.
_MD_INLINE = re.compile(r"[\\`*\[\]<|~#]|&(?=#?\w+;)|(?<![^\W_])_|_(?![^\W_])")
#: What Markdown reads as syntax at the start of a paragraph or list item: a block quote, a
#: list item, a setext underline, a numbered item ("1." or "1)"); the backslash goes before
#: the character that makes it syntax.
_MD_BLOCK_START = re.compile(r"^(\d*)((?<!\d)[>+=-]|(?<=\d)[.)](?=\s|$))")


def md_escape(text: str) -> str:
    """`text` shown as is in Markdown: syntax characters backslash-escaped, lines joined."""
    one_line = " ".join(str(text).splitlines())
    return _MD_INLINE.sub(lambda m: "\\" + m.group(0), one_line)


def md_block(text: str) -> str:
    """`text` as a paragraph or list item's own text: escaped, and not opening a block."""
    escaped = md_escape(text).lstrip()
    return _MD_BLOCK_START.sub(r"\1\\\2", escaped)
