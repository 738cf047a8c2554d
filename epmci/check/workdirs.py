"""Where a check's engine outputs go, and how long they stay. A passed check's are removed;
a failed check's are kept for debugging, but a self-hosted runner's /tmp outlives its jobs,
so of the failed checks' outputs in one place only the newest few stay (as pytest keeps its
last three base temp dirs); outputs kept on request (--keep-work) are never removed. A
stopped epmci removes its running checks' outputs (remove_live_workdirs)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

PREFIX = "epmci-check-"
KEPT_MARK = ".epmci-kept"     # in a finished check's kept dir: why it was kept, and when
KEEP_FAILED = 3               # failed checks' outputs kept in one place (--keep-failed)

_live_workdirs: set[Path] = set()     # a running check's engine outputs, not to be kept
_live_lock = threading.Lock()


def new_workdir(base: str | os.PathLike | None, live: bool) -> Path:
    """A fresh dir for one check's engine outputs under base (default: the temp dir); `live`:
    removed if epmci is stopped while the check runs."""
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
    wd = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
    if live:
        with _live_lock:
            _live_workdirs.add(wd)
    return wd


def finish_workdir(wd: Path, kept_because: str | None, keep_failed: int) -> dict:
    """A finished check's outputs: removed (kept_because None), or kept with a mark saying
    why ("failed", "asked"). After a failure only the newest keep_failed failed checks'
    outputs in that place stay, this one's included (0: none, not even this one's). What
    the report's meta records of it."""
    with _live_lock:
        _live_workdirs.discard(wd)
    meta: dict = {}
    if kept_because == "failed":           # pruned before this one is marked: it is not counted
        meta = {"workdirs_removed": [str(d) for d in prune_failed(wd.parent, max(keep_failed - 1, 0))],
                "keep_failed": keep_failed}
    if kept_because is None or kept_because == "failed" and keep_failed == 0:
        shutil.rmtree(wd, ignore_errors=True)
        return meta
    try:
        (wd / KEPT_MARK).write_text(json.dumps({"why": kept_because, "at": time.time()}))
    except OSError:
        pass                   # unmarked, it is never pruned: kept is the safe side
    return {**meta, "workdir_kept": True}


def prune_failed(base: Path, keep: int) -> list[Path]:
    """Remove the failed checks' outputs in base beyond the newest `keep`; the dirs removed.
    Only marked dirs count: a running check's (in this epmci or another) has no mark yet."""
    failed = []
    for d in base.glob(PREFIX + "*"):
        try:
            mark = json.loads((d / KEPT_MARK).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(mark, dict) and mark.get("why") == "failed" and isinstance(mark.get("at"), (int, float)):
            failed.append((mark["at"], d))
    old = [d for _, d in sorted(failed, reverse=True)[keep:]]
    for d in old:
        shutil.rmtree(d, ignore_errors=True)
    return old


def remove_live_workdirs() -> int:
    """Remove the engine outputs of every check still running (an epmci being stopped: a
    self-hosted runner keeps its disk between jobs, and cancelled runs would fill it),
    unless the check was asked to keep them. The number removed."""
    with _live_lock:
        live = list(_live_workdirs)
        _live_workdirs.clear()
    for wd in live:
        # renamed first, at once: a worker thread still running makes no new run dir in it
        # (CheckContext.dir creates no parents), and what it still writes goes with the rename
        gone = wd.with_name(wd.name + ".removing")
        try:
            wd.rename(gone)
        except OSError:
            gone = wd
        for _ in range(40):
            shutil.rmtree(gone, ignore_errors=True)
            if not gone.exists():
                break
            time.sleep(0.05)
    return len(live)
