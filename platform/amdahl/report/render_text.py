"""Terminal (rich) and Markdown renderings of the report document: the terminal prints the
short view (brief.py) unless asked for every section."""

from __future__ import annotations

import re
from urllib.parse import quote

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from amdahl.report.brief import brief_sections
from amdahl.report.build import Report
from amdahl.report.document import TEXT_COLUMNS, Section, Table
from amdahl.report.sections import sections


def print_sections(secs: list[Section], console: Console, compact: bool = False) -> None:
    """`compact`: tables without outer borders, their text columns never wrapped (the short
    view's labels stay one line each; headers of number columns wrap instead)."""
    for sec in secs:
        console.rule(f"[bold]{escape(sec.title)}")
        for p in sec.paras:
            console.print(escape(p))
        for t in sec.tables:
            console.print(_rich_table(t, compact, console.width))
            for n in t.notes:
                console.print(f" - {escape(n)}")
        for b in sec.bullets:
            console.print(f" - {escape(b)}")
        for text, path in sec.links:
            console.print(f" - {escape(text)}: {escape(path)}")
        console.print()


def _rich_table(t: Table, compact: bool = False, width: int = 0) -> RichTable:
    title = escape(t.title) if t.title else None
    if compact:
        table = RichTable(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    else:
        table = RichTable(title=title, title_justify="left")
    texts = [h in TEXT_COLUMNS or h.startswith("against") for h in t.headers]
    widths, fits = _compact_widths(t, texts, width) if compact else ([None] * len(texts), False)
    for h, text, w in zip(t.headers, texts, widths, strict=True):
        table.add_column(
            escape(h),
            justify="left" if text else "right",
            overflow="fold",
            no_wrap=fits and text,
            min_width=w,
        )
    for row in t.rows:
        styled = [escape(v) for v in row]
        styled = [f"[red]{v}[/]" if v == "FLAGGED" else v for v in styled]
        table.add_row(*styled)
    return table


def _compact_widths(t: Table, texts: list[bool], width: int) -> tuple[list[int | None], bool]:
    """Least widths that keep the short view's labels whole: every text column on one line
    where the table fits `width` (number headers may wrap); else the configuration column (or
    the first text column) as wide as the rest leaves it at their longest words, so the other
    text wraps first and the label at most once."""
    cells = [max((len(r[i]) for r in t.rows), default=0) for i in range(len(t.headers))]
    words = [max((len(w) for w in h.split()), default=0) for h in t.headers]
    needs = [c if x else max(c, w) for c, w, x in zip(cells, words, texts, strict=True)]
    gaps = 3 * len(t.headers)
    if sum(needs) + gaps <= width:
        return [n if x else None for n, x in zip(needs, texts, strict=True)], True
    out: list[int | None] = [None] * len(t.headers)
    if True in texts:
        i = t.headers.index("configuration") if "configuration" in t.headers else texts.index(True)
        least = [
            max((len(w) for r in t.rows for w in r[k].split()), default=0) if x else n
            for k, (n, x) in enumerate(zip(needs, texts, strict=True))
        ]
        out[i] = min(cells[i], max(12, width - gaps - (sum(least) - least[i])))
    return out, False


def print_report(report: Report, console: Console, full: bool = False) -> None:
    """The short view (brief.py: the answer, the top configurations, what it left out), or
    with `full` every section, as report.md has them."""
    if full:
        print_sections(sections(report), console)
    else:
        print_sections(brief_sections(report), console, compact=True)


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
        for text, path in sec.links:
            out.append(f"- [{md_escape(text)}]({quote(path)})")
        if sec.bullets or sec.links:
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def markdown_table(t: Table) -> str:
    lines = [f"**{md_escape(t.title)}**\n"] if t.title else []
    lines.append("| " + " | ".join(md_escape(h) for h in t.headers) + " |")
    lines.append("|" + "|".join("---" for _ in t.headers) + "|")
    for row in t.rows:
        lines.append("| " + " | ".join(md_escape(v) for v in row) + " |")
    if t.notes:
        lines.append("")
        lines += [f"- {md_block(n)}" for n in t.notes]
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
