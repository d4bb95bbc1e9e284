"""Terminal (rich) and Markdown renderings of the report document: the terminal prints the
short view (brief.py) unless asked for every section."""

from __future__ import annotations

import re
from urllib.parse import quote

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from amdahl.report.brief import brief_sections
from amdahl.report.build import Report
from amdahl.report.document import TEXT_COLUMNS, Section, Table
from amdahl.report.sections import sections


def print_sections(secs: list[Section], console: Console, compact: bool = False) -> None:
    """`compact`: tables without outer borders, their text columns kept on one line first (the
    short view's labels); headers of number columns wrap instead. A table too wide for the
    console leaves out its last columns and says which (`_layout`)."""
    for sec in secs:
        console.rule(f"[bold]{escape(sec.title)}")
        for p in sec.paras:
            console.print(escape(p))
        for t in sec.tables:
            table, left_out = _rich_table(t, compact, console.width)
            console.print(table)
            for n in t.notes:
                console.print(f" - {escape(n)}")
            if left_out:
                console.print(f" - {escape(_left_out_note(left_out))}")
        for b in sec.bullets:
            console.print(f" - {escape(b)}")
        for text, path in sec.links:
            console.print(f" - {escape(text)}: {escape(path)}")
        console.print()


def _left_out_note(headers: list[str]) -> str:
    names = ", ".join(f'"{h}"' for h in headers)
    return f"left out at this terminal width: {names} (a wider terminal shows every column)"


def _rich_table(t: Table, compact: bool = False, width: int = 0) -> tuple[RichTable, list[str]]:
    """The table for a console `width` columns wide (0: any width), and the headers of the
    columns it leaves out to fit there."""
    title = escape(t.title) if t.title else None
    if compact:
        table = RichTable(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    else:
        table = RichTable(title=title, title_justify="left")
    texts = [h in TEXT_COLUMNS or h.startswith("against") for h in t.headers]
    edges = 0 if compact else 2
    shown, widths = _layout(t, texts, compact, width - edges) if width else (None, None)
    keep = shown if shown is not None else list(range(len(t.headers)))
    for i in keep:
        table.add_column(
            escape(t.headers[i]),
            justify="left" if texts[i] else "right",
            overflow="fold",
            width=widths[i] if widths else None,
        )
    for row in t.rows:
        styled = [escape(row[i]) for i in keep]
        styled = [f"[red]{v}[/]" if v == "FLAGGED" else v for v in styled]
        table.add_row(*styled)
    return table, [h for i, h in enumerate(t.headers) if i not in keep]


def _words(text: str) -> int:
    """The widest word of `text`: the least a column may be without breaking it."""
    return max((cell_len(w) for w in text.split()), default=0)


def _layout(
    t: Table, texts: list[bool], compact: bool, width: int
) -> tuple[list[int] | None, list[int] | None]:
    """The columns shown and their content widths, so that no header and no value breaks
    inside a word and the table fits `width` (without its outer edges). None, None where the
    table fits as it is: rich lays it out, every header and value on one line.

    A column is at least its widest header word and widest value word (values and headers
    wrap at spaces); while those do not fit, the last column is left out (empty columns first,
    never the first column or the configuration). The room left goes to the short view's text
    columns first (`compact`: its labels stay on one line where they can, the configuration
    first), then to the narrowest columns, so the widest wrap first (as rich shrinks them).
    """
    n = len(t.headers)
    cols = [[r[i] for r in t.rows] for i in range(n)]
    want = [max([cell_len(t.headers[i]), *(cell_len(v) for v in cols[i])]) for i in range(n)]
    least = [max([_words(t.headers[i]), *(_words(v) for v in cols[i])]) for i in range(n)]
    room = lambda keep: width - 3 * len(keep) + 1  # noqa: E731 - padding 2 and a rule each
    keep = list(range(n))
    if sum(want) <= room(keep):
        return None, None
    label = t.headers.index("configuration") if "configuration" in t.headers else 0
    droppable = [i for i in reversed(range(n)) if i not in (0, label)]
    droppable.sort(key=lambda i: any(cols[i]))  # empty columns first, each kind last first
    while sum(least[i] for i in keep) > room(keep) and droppable:
        keep.remove(droppable.pop(0))
    widths = dict.fromkeys(range(n), 0) | {i: least[i] for i in keep}
    spare = room(keep) - sum(widths.values())
    first = [label] + [i for i in keep if texts[i] and i != label] if compact else []
    for i in (i for i in first if i in keep):
        grow = max(0, min(want[i] - widths[i], spare))
        widths[i], spare = widths[i] + grow, spare - grow
    while spare > 0:
        short = [i for i in keep if widths[i] < want[i]]
        if not short:
            break
        narrowest = min(short, key=lambda i: widths[i])
        widths[narrowest] += 1
        spare -= 1
    return keep, [widths[i] for i in range(n)]


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
