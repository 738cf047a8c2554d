"""What this process may use of the machine: its memory (the smallest cgroup limit above
it, else MemTotal) and its CPUs (the affinity mask, capped by a cgroup CPU quota). The
engine's defaults come from these: the RAM budget of a paged run and the thread count.

A limit, not what is free at the moment: the default arena is sized from the budget, and
an arena that moved with the page cache or a neighbour's job would change the counters
between two runs of one command. The engine does not import the gate (it is what the gate
tests), so it reads the cgroup files itself.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_dirs(controller: str) -> list[Path]:
    """This process's cgroup directories of `controller`, innermost first, up to the root
    (v1: its own hierarchy; v2: the unified one)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") or controllers == "":
            top = CGROUP_ROOT / controller if controllers else CGROUP_ROOT
            if not top.is_dir():
                continue
            d = top / path.strip("/")
            return [d, *[p for p in d.parents if p == top or top in p.parents]]
    return []


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def memory_limit() -> tuple[int, str]:
    """(bytes, where they come from): the smallest memory limit of this process's cgroups
    (v1 memory.limit_in_bytes, v2 memory.max), else MemTotal."""
    limits = []
    for d in _cgroup_dirs("memory"):
        for name in ("memory.limit_in_bytes", "memory.max"):
            v = _read(d / name)
            if v and v.isdigit():
                limits.append(int(v))
    total = None
    for line in (_read(Path("/proc/meminfo")) or "").splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
    if limits and (total is None or min(limits) < total):
        return min(limits), "its cgroup's memory limit"
    if total is None:
        raise OSError("cannot tell this machine's memory (/proc/meminfo has no MemTotal)")
    return total, "the machine's MemTotal"


def usable_cpus() -> int:
    """CPUs this process may run on, capped by a cgroup CPU quota (v1 cfs_quota/period, v2
    cpu.max), at least 1."""
    n = len(os.sched_getaffinity(0))
    for d in _cgroup_dirs("cpu"):
        quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        if quota is None and (v := _read(d / "cpu.max")):
            quota, _, period = v.partition(" ")
        if quota and period and quota.isdigit() and period.isdigit() and int(period) > 0:
            n = min(n, math.ceil(int(quota) / int(period)))
    return max(1, n)
