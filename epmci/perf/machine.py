"""Machine fingerprint: what timing figures depend on, so baselines are compared like with like."""

from __future__ import annotations

import hashlib
import os
import platform
import resource
import subprocess
import time
from pathlib import Path

from ..cgroups import cgroup_memory_limit_gib, mem_total_gib

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


def cpu_flags() -> frozenset[str]:
    """This CPU's flags as /proc/cpuinfo names them (empty where it cannot be read)."""
    return frozenset(_cpuinfo().get("flags", "").split())


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


def current_commit() -> str | None:
    """The commit being checked: $GITHUB_SHA in a workflow, else git's HEAD here (None: neither)."""
    if os.environ.get("GITHUB_SHA"):
        return os.environ["GITHUB_SHA"]
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def fingerprint(model_dir: str | os.PathLike = ".") -> dict:
    cpu = _cpuinfo()
    flags = sorted(cpu_flags())
    fs_type, device = _mount_of(Path(model_dir))
    return {
        "cpu_model": cpu.get("model name", platform.processor() or platform.machine()),
        "cpu_flags_sha256": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:16],
        "cpu_flags_simd": [f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4"))],
        "n_cpus": cpu_count(),
        "mem_total_gib": mem_total_gib(),
        "mem_limit_gib": cgroup_memory_limit_gib(),
        "kernel": platform.release(),
        "fs_type": fs_type,
        "disk": _disk_model(device) or device,
    }


def mismatches(recorded: dict, current: dict) -> list[str]:
    """Timing-relevant keys on which two fingerprints differ, as 'key: recorded != current'."""
    return [f"{k}: {recorded.get(k)!r} != {current.get(k)!r}"
            for k in TIMING_KEYS if recorded.get(k) != current.get(k)]
