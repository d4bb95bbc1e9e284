"""A real `mlflow server` for integration tests: a child process the test owns, bound to
127.0.0.1 on a free port, artifacts proxied through it, and stopped by its own handle (never by
process name). Imported by test modules like idx_files (not collected: no test_ prefix)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mlflow(port: int, store: Path) -> subprocess.Popen:
    log = (store / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{store / 'mlflow.db'}",
            "--serve-artifacts",
            "--artifacts-destination",
            str(store / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()  # the child holds its own copy
    return wait_until_healthy(proc, port, store / "server.log", timeout=120)


def wait_until_healthy(
    proc: subprocess.Popen, port: int, log: Path, timeout: float
) -> subprocess.Popen:
    """`proc` once its /health on 127.0.0.1:`port` answers; else stopped, and a RuntimeError
    with the tail of its `log`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    stop(proc)
    tail = log.read_text(errors="replace")[-3000:]
    raise RuntimeError(f"mlflow did not start (exit {proc.returncode}):\n{tail}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)  # our own server's process group, by its handle
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
