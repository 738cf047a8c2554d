"""Machine fingerprint: what timing figures depend on, so baselines are compared like with like."""

from __future__ import annotations

import hashlib
import os
import platform
import resource
import time
from pathlib import Path

# Keys that must agree for tok/s to be comparable; the others are reported only.
TIMING_KEYS = ("cpu_model", "cpu_flags_sha256", "n_cpus", "mem_total_gib", "mem_limit_gib", "fs_type")


def _busy_cpu_seconds() -> float | None:
    """CPU seconds all CPUs spent on anything but idle and iowait since boot (/proc/stat),
    steal included: a hypervisor taking the CPU is contention too. None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    v = [int(x) for x in fields[1:9]]            # user nice system idle iowait irq softirq steal
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class CpuContention:
    """`with CpuContention() as c: run()` -- afterwards `c.other_pct` is the CPU time other
    processes took during the block, in % of the machine's CPU capacity (None where
    /proc/stat is missing). A timing taken while it was high measured the neighbours too."""

    def __enter__(self) -> "CpuContention":
        self.other_pct: float | None = None
        self._t0, self._busy0, self._own0 = time.monotonic(), _busy_cpu_seconds(), _own_cpu_seconds()
        return self

    def __exit__(self, *exc) -> None:
        wall, busy = time.monotonic() - self._t0, _busy_cpu_seconds()
        if busy is None or self._busy0 is None or wall <= 0:
            return
        other = (busy - self._busy0) - (_own_cpu_seconds() - self._own0)
        self.other_pct = round(max(0.0, 100.0 * other / (wall * (os.cpu_count() or 1))), 1)


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                k, v = (s.strip() for s in line.split(":", 1))
                info.setdefault(k, v)
    except OSError:
        pass
    return info


def _mem_total_gib() -> float:
    total = _meminfo_mib("MemTotal")
    return round(total / 1024, 1) if total is not None else 0.0


# cgroup v1 and v2 names of: the limit, the usage, the reclaimable page cache in memory.stat
_CGROUP_FILES = {"v1": ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
                 "v2": ("memory.max", "memory.current", "inactive_file")}


def _memory_cgroups() -> list[tuple[Path, str]]:
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


def _cgroup_mem_limit_gib() -> float | None:
    """The smallest memory limit on the way from this process's cgroup to the root (cgroup v1
    memory.limit_in_bytes or v2 memory.max), in GiB; None when unlimited or unknown. A box
    capped at 8 GB reports its full RAM in /proc/meminfo, so this is what the cap shows in."""
    limits = [v for d, ver in _memory_cgroups() if (v := _read_int(d / _CGROUP_FILES[ver][0])) is not None]
    return round(min(limits) / 2**30, 2) if limits else None


def memory_limit_mib() -> float | None:
    """The machine's memory as a job sees it for good: its cgroup limit, else MemTotal (not
    what is free at the moment, which moves with the page cache and other jobs)."""
    limit, total = _cgroup_mem_limit_gib(), _meminfo_mib("MemTotal")
    sizes = [x for x in (None if limit is None else limit * 1024, total) if x is not None]
    return min(sizes) if sizes else None


def _meminfo_mib(key: str) -> float | None:
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
    best = _meminfo_mib("MemAvailable")
    for d, ver in _memory_cgroups():
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


def _mount_of(path: Path) -> tuple[str, str]:
    """(fs type, device) of the mount holding path, from /proc/mounts (longest prefix)."""
    best = ("", "", "")
    try:
        p = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[1]):
                best = (dev, mnt, fstype)
    except OSError:
        pass
    return best[2], best[0]


def _disk_model(device: str) -> str:
    name = Path(device).name
    for cand in (name, name.rstrip("0123456789"), name.split("p")[0] if name.startswith("nvme") else name):
        p = Path("/sys/block") / cand / "device" / "model"
        if p.exists():
            return p.read_text().strip()
    return ""


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def fingerprint(model_dir: str | os.PathLike = ".") -> dict:
    cpu = _cpuinfo()
    flags = sorted(cpu.get("flags", "").split())
    fs_type, device = _mount_of(Path(model_dir))
    return {
        "cpu_model": cpu.get("model name", platform.processor() or platform.machine()),
        "cpu_flags_sha256": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:16],
        "cpu_flags_simd": [f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4"))],
        "n_cpus": cpu_count(),
        "mem_total_gib": _mem_total_gib(),
        "mem_limit_gib": _cgroup_mem_limit_gib(),
        "kernel": platform.release(),
        "fs_type": fs_type,
        "disk": _disk_model(device) or device,
    }


def mismatches(recorded: dict, current: dict) -> list[str]:
    """Timing-relevant keys on which two fingerprints differ, as 'key: recorded != current'."""
    return [f"{k}: {recorded.get(k)!r} != {current.get(k)!r}"
            for k in TIMING_KEYS if recorded.get(k) != current.get(k)]
