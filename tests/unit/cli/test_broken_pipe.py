"""`platform report DIR | head`: the reader stops after a line; the command ends as Unix tools
do when their pipe closes (141), quietly, not with 1 (which means trials failed)."""

import fcntl
import os
import subprocess
import sys

from report_rows import scaling_rows, write_sweep

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def test_report_into_a_closed_pipe_exits_141_without_a_traceback(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", scaling_rows())
    read, write = os.pipe()
    # The smallest pipe buffer Linux allows (one page), far below the report's length: the
    # command is still writing when the reader closes, whatever the timing.
    fcntl.fcntl(write, F_SETPIPE_SZ, 4096)
    cmd = "from amdahl.cli.commands import main; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", cmd, "report", "--all", str(sweep)],
        stdout=write,
        stderr=subprocess.PIPE,
    )
    os.close(write)
    with os.fdopen(read, "rb") as reader:
        first = reader.readline()  # like `head -1`: one line, then the pipe closes
    _, stderr = proc.communicate(timeout=120)
    assert first.strip()
    full = subprocess.run(
        [sys.executable, "-c", cmd, "report", "--all", str(sweep)], capture_output=True
    )
    assert len(full.stdout) > 4 * 4096 and full.returncode == 0
    assert proc.returncode == 141, stderr.decode()
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr
