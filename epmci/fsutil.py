"""Files epmci writes appear whole or not at all: a temp file in the same directory, fsynced,
then renamed over the target. A JSON document epmci reads is one object or one line's
error naming the file. A cache directory shared by concurrent checks keeps its newest
files, whoever else prunes it at the same time."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .errors import InputError


def read_json(path: str | os.PathLike, what: str) -> dict:
    """The JSON object in `path` (InputError naming the file and what is wrong with it)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(str(path), f"cannot read the {what}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(str(path), f"the {what} is not JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(data, dict):
        raise InputError(str(path), f"the {what} is not a JSON object")
    return data


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)          # an ordinary file, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def keep_newest(directory: Path, pattern: str, keep: int) -> None:
    """Remove the files matching `pattern` in `directory` beyond the newest `keep`. Other
    processes prune the same cache at once (parallel checks, pytest workers): a file gone
    between listing it and reading its time is simply no longer there."""
    aged = []
    for p in directory.glob(pattern):
        try:
            aged.append((p.stat().st_mtime, p))
        except FileNotFoundError:
            continue
    for _, old in sorted(aged, reverse=True)[keep:]:
        old.unlink(missing_ok=True)
