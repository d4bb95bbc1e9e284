"""The one exception type that means "the user asked for something we cannot do".

The CLI turns it into a single message and exit code 2 (no traceback unless --debug), so every
module raises it with a message that already names the input, the bad value and the fix.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a sweep file, an override, a workload import, a results file, a CLI argument."""

    exit_code = 2
