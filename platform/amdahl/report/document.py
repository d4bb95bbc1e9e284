"""The report as a neutral document: sections of paragraphs, tables and bullets, and how numbers
are written in them. The terminal, Markdown and HTML renderers all format these, so the three say
the same thing; sections.py, model_sections.py, prediction_document.py and comparison.py fill
them.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from amdahl.analysis.stats import Stat


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    title: str = ""
    #: What the table's own rows say beside it (a scaling curve's fit and ceiling), printed
    #: right after it.
    notes: list[str] = field(default_factory=list)


@dataclass
class Section:
    key: str
    title: str
    paras: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    bullets: list[str] = field(default_factory=list)
    #: (text, path relative to the sweep directory): files the reader opens (profiler traces);
    #: links in report.md/html, the path beside the text in the terminal.
    links: list[tuple[str, str]] = field(default_factory=list)


class Footnotes:
    """Caveats numbered once, in the order first cited (`texts` may start the list): a row or
    section cites their numbers and the notes hold their text, so a paragraph many rows carry
    is printed once."""

    def __init__(self, texts: list[str] | tuple[str, ...] = ()) -> None:
        self.texts = list(texts)

    def number(self, caveat: str) -> str:
        """`caveat`'s number, "[n]", numbering it if new."""
        if caveat not in self.texts:
            self.texts.append(caveat)
        return f"[{self.texts.index(caveat) + 1}]"

    def cite(self, caveats: list[str] | tuple[str, ...]) -> str:
        """The numbers of `caveats`, "[1], [3]" ("" for none)."""
        return ", ".join(self.number(c) for c in caveats)

    @property
    def notes(self) -> list[str]:
        return [f"{self.number(c)} {c}" for c in self.texts]


#: Columns holding text (left-aligned by the renderers); the rest hold numbers.
TEXT_COLUMNS = frozenset(
    {"configuration", "best by", "note", "reason", "status", "verdict", "bottleneck"}
)


# --------------------------------------------------------------------------- numbers


def rate(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:,.0f}"


def spread(s: Stat | None) -> str:
    if s is None:
        return ""
    return "n=1" if s.n <= 1 else f"{s.rel_spread:.1%} (n={s.n})"


def times(x: float | None, s: Stat | None = None) -> str:
    if x is None:
        return "n/a"
    if s is not None and s.n > 1 and s.spread > 0:
        return f"{x:.2f}x ({s.lo:.2f}-{s.hi:.2f})"
    return f"{x:.2f}x"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f}"


def mib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:,.1f}"
