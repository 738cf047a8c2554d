"""What the memory cgroups this process is in say -- their limits, what they use, how often
the kernel's OOM killer struck in them -- and /proc/meminfo: the memory a job really has (a
box capped at 8 GB reports its full RAM in /proc/meminfo), cgroup v1 and v2 alike."""

from __future__ import annotations

from pathlib import Path


# cgroup v1 and v2 names of: the limit, the usage, the reclaimable page cache in memory.stat
_CGROUP_FILES = {"v1": ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
                 "v2": ("memory.max", "memory.current", "inactive_file")}


def memory_cgroups() -> list[tuple[Path, str]]:
    """This process's memory cgroup and its ancestors up to the root, with the version."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    cg, top, version = None, None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            cg, top, version = parts[2], Path("/sys/fs/cgroup/memory"), "v1"
            break
    if cg is None:
        for line in lines:
            if line.startswith("0::"):
                cg, top, version = line[3:], Path("/sys/fs/cgroup"), "v2"
    if cg is None:
        return []
    out = []
    d = top / cg.strip("/") if cg.strip("/") else top
    while True:
        out.append((d, version))
        if d == top or top not in d.parents:
            return out
        d = d.parent


def _read_int(path: Path) -> int | None:
    try:
        v = path.read_text().strip()
    except OSError:
        return None
    return int(v) if v.isdigit() and int(v) < (1 << 60) else None


def cgroup_memory_limit_gib() -> float | None:
    """The smallest memory limit on the way from this process's cgroup to the root (cgroup v1
    memory.limit_in_bytes or v2 memory.max), in GiB; None when unlimited or unknown. A box
    capped at 8 GB reports its full RAM in /proc/meminfo, so this is what the cap shows in."""
    limits = [v for d, ver in memory_cgroups() if (v := _read_int(d / _CGROUP_FILES[ver][0])) is not None]
    return round(min(limits) / 2**30, 2) if limits else None


def memory_limit_mib() -> float | None:
    """The machine's memory as a job sees it for good: its cgroup limit, else MemTotal (not
    what is free at the moment, which moves with the page cache and other jobs)."""
    limit, total = cgroup_memory_limit_gib(), meminfo_mib("MemTotal")
    sizes = [x for x in (None if limit is None else limit * 1024, total) if x is not None]
    return min(sizes) if sizes else None


def meminfo_mib(key: str) -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def available_memory_mib() -> float | None:
    """Memory a new process can still take without swapping or meeting a cgroup limit:
    MemAvailable, and under each limited cgroup on the way to the root its limit minus what
    it uses (its inactive page cache counted as free, the kernel reclaims that first).
    None when unknown."""
    best = meminfo_mib("MemAvailable")
    for d, ver in memory_cgroups():
        limit_f, usage_f, cache_key = _CGROUP_FILES[ver]
        limit, usage = _read_int(d / limit_f), _read_int(d / usage_f)
        if limit is None or usage is None:
            continue
        cache = 0
        try:
            for line in (d / "memory.stat").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == cache_key and v.strip().isdigit():
                    cache = int(v)
        except OSError:
            pass
        free = (limit - max(0, usage - cache)) / 2**20
        best = free if best is None else min(best, free)
    return best


def mem_total_gib() -> float:
    total = meminfo_mib("MemTotal")
    return round(total / 1024, 1) if total is not None else 0.0


def oom_kills() -> int:
    """Processes the OOM killer has killed so far in this process's memory cgroups (v1
    memory.oom_control, v2 memory.events: `oom_kill N`), summed over the way to the root; a
    run whose count rose while it died of SIGKILL was killed for memory."""
    total = 0
    for d, ver in memory_cgroups():
        try:
            text = (d / ("memory.oom_control" if ver == "v1" else "memory.events")).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill" and v.strip().isdigit():
                total += int(v)
    return total
