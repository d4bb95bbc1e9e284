"""Keeping a sweep's configuration private: owner-only files, and no passwords in URIs.

Every file in a sweep directory that can hold configuration (spec.yaml, plan.json, tracking.json,
results.parquet, calibration.json, the reports, ray.log) is created readable by its owner only,
inside a directory only its owner can enter, whatever the umask. `write_private` also replaces
the file whole: the bytes go to a uniquely named temporary file beside it, are synced, and are
renamed over it, so a reader never sees half a file and two writers never share a temporary file.

A password inside a URI (`http://user:pw@host`, `s3://KEY:SECRET@bucket`) would be copied into
all of these files and into MLflow, so the sweep file refuses one (`uri_passwords`, used by
amdahl.spec.load), and anything URI-like that reaches a log or an error message is shown with its
password masked (`redact_uris`): URIs from the environment (MLFLOW_TRACKING_URI) may carry one.
Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

#: Mode of the files written here, and of a new sweep directory.
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
MASK = "***"

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_TOKEN_END = re.compile(r"[\s'\"<>`]")
#: After `user:`, a port and maybe a path: `http://host:5000/x@y` holds no password.
_PORT_AND_PATH = re.compile(r"\d*(?:[/?#].*)?")


def write_private(path: str | Path, data: bytes | str) -> Path:
    """Replace `path` whole with `data` (str as UTF-8), readable by its owner only."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    # mkstemp creates the file 0o600 under a name no other writer uses.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def touch_private(path: str | Path) -> Path:
    """Create `path` empty if missing (for a writer that appends, like a log handler) and make
    it readable by its owner only."""
    path = Path(path)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE))
    os.chmod(path, PRIVATE_FILE)
    return path


def private_dir(path: str | Path, exist_ok: bool = False) -> Path:
    """Create directory `path` (its missing parents as usual) that only its owner can enter.

    Like `Path.mkdir`, raises FileExistsError when it exists, unless `exist_ok`; an existing
    directory keeps its mode.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=PRIVATE_DIR)
    except FileExistsError:
        if not exist_ok or not path.is_dir():
            raise
    return path


def _password_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each password inside a URI's userinfo in `text`."""
    spans = []
    for scheme in _SCHEME.finditer(text):
        start = scheme.end()
        end_match = _TOKEN_END.search(text, start)
        token = text[start : end_match.start() if end_match else len(text)]
        authority = re.split(r"[/?#]", token, maxsplit=1)[0]
        if "@" in authority:  # the standard form; a raw `@` in the password is kept with it
            userinfo = authority.rpartition("@")[0]
        elif "@" in token:  # a password with a raw `/` (AWS secrets have them) ends early
            userinfo = token.partition("@")[0]
            user, _, rest = userinfo.partition(":")
            if not rest or "/" in user or _PORT_AND_PATH.fullmatch(rest):
                continue
        else:
            continue
        user, colon, password = userinfo.partition(":")
        if colon and password and not (spans and spans[-1][1] > start):  # not inside the last
            spans.append((start + len(user) + 1, start + len(userinfo)))
    return spans


def uri_passwords(text: str) -> bool:
    """Whether `text` holds a URI with a password (`scheme://user:password@...`)."""
    return bool(_password_spans(text))


def redact_uris(text: str) -> str:
    """`text` with the password of every URI in it masked: `http://user:***@host`."""
    for start, end in reversed(_password_spans(text)):
        text = text[:start] + MASK + text[end:]
    return text
