"""The CLI's rich console: one place decides how output ends when its reader goes away.

`platform report DIR | head`: rich's Console exits 1 when the pipe closes, which the CLI's exit
codes give to "trials failed". This one exits as Unix tools do when SIGPIPE kills them.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

#: 128 + SIGPIPE (13): what a shell reports for `ls | head` under `set -o pipefail`.
EXIT_BROKEN_PIPE = 141


class Terminal(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing left to flush at exit
        raise SystemExit(EXIT_BROKEN_PIPE)
