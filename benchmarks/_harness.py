"""What every benchmark here measures by: interleaved rounds with the arm order rotated each
round (no arm always runs first, on a cold or a warm box), medians with their spread, and a
stamp saying what code and which machine a printed figure came from.

A script folder's module, not the package's: the benchmarks import it as `_harness` (their own
folder is first on sys.path when run as `python benchmarks/NAME.py`).
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

ROOT = Path(__file__).resolve().parents[1]


def rotated(order: Sequence[T], round_: int) -> list[T]:
    """`order` rotated left by `round_` places: over len(order) rounds every arm runs once in
    every position."""
    if not order:
        return list(order)
    k = round_ % len(order)
    return [*order[k:], *order[:k]]


def interleaved(
    arms: Mapping[str, Callable[[], R]],
    rounds: int,
    on_round: Callable[[int, list[str], dict[str, R]], None] | None = None,
) -> dict[str, list[R]]:
    """Each arm's results, one per round: every round runs every arm once, in `rotated` order.
    `on_round(round, order, results)` hears each round as it ends (a per-round line)."""
    runs: dict[str, list[R]] = {name: [] for name in arms}
    for r in range(rounds):
        order = rotated(list(arms), r)
        got = {name: arms[name]() for name in order}
        for name, value in got.items():
            runs[name].append(value)
        if on_round is not None:
            on_round(r, order, got)
    return runs


@dataclass(frozen=True)
class Spread:
    """A median and the range it sits in (min-max over the values it summarises)."""

    median: float
    lo: float
    hi: float
    n: int

    def text(self, fmt: str = ".3f", unit: str = "") -> str:
        """`1.002 (0.990-1.010)`: the median, then the range."""
        return (
            f"{self.median:{fmt}}{unit} ({self.lo:{fmt}}-{self.hi:{fmt}}{unit})"
            if self.n
            else "n/a"
        )

    def min_max(self, fmt: str = ".3f", unit: str = "") -> str:
        """`1.002 (min 0.990, max 1.010)`."""
        if not self.n:
            return "n/a"
        return f"{self.median:{fmt}}{unit} (min {self.lo:{fmt}}, max {self.hi:{fmt}})"


def spread(values: Sequence[float]) -> Spread:
    """The median and range of `values` (NaNs, for none: n is 0)."""
    if not values:
        nan = float("nan")
        return Spread(nan, nan, nan, 0)
    return Spread(statistics.median(values), min(values), max(values), len(values))


def paired(a: Sequence[float], b: Sequence[float], how: Callable[[float, float], float]) -> Spread:
    """`how(a[i], b[i])` over the rounds (a per-round ratio: operator.truediv, or difference:
    operator.sub), summarised: a pair shares a round, so the box's drift between rounds
    cancels."""
    return spread([how(x, y) for x, y in zip(a, b, strict=True)])


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a torch.distributed rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_smoke_flag(parser: argparse.ArgumentParser) -> None:
    """`--smoke`: the benchmark's whole path at its smallest size (one round, a few steps), so
    tests/integration/test_benchmarks_smoke.py sees it still runs; its figures mean nothing."""
    parser.add_argument(
        "--smoke", action="store_true", help="one round at the smallest size: a check, no figure"
    )


def stamp() -> str:
    """Where a result came from: git commit (and whether the tree had uncommitted changes),
    the host's cores and CPU model, torch and Ray versions, and the UTC time."""
    commit, dirty = _git()
    return (
        f"[stamp] commit {commit}{' (dirty)' if dirty else ''}; {os.cpu_count()} cores, "
        f"{_cpu_model()}; torch {_version('torch')}, ray {_version('ray')}; "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}"
    )


def print_stamp() -> None:
    print(stamp(), flush=True)


def _git() -> tuple[str, bool]:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
        return done.stdout.strip()

    try:
        return git("rev-parse", "--short=12", "HEAD"), bool(git("status", "--porcelain"))
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"
