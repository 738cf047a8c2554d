"""How fast this machine is now, the engine aside: a fixed compute workload and the disk's
throughput for the engine's reads.

A tok/s baseline in a golden file was timed on the profile's machine at one moment; a shared
or virtual machine is not as fast every day (its disk above all). Golden timing records this
speed beside its samples, with the share of decode time the engine waited for reads, so a
tok/s drop against golden can be set against what the machine's own slowdown predicts
(`machine_factor`): a drop the machine explains is inconclusive, not a regression.
"""

from __future__ import annotations

import mmap
import os
import random
import statistics
import threading
import time

import numpy as np

from ..contract.process import drop_page_cache
from ..gguf.file import EXPERT_PARTS, ModelFile

# The compute probe takes the best of several tries: on a shared VM a try is only ever
# slowed by what else runs, so the fastest is the steadiest estimate of the CPU itself
# (timeit's rule). The disk probe takes the median: a virtual disk also reads in bursts
# faster than it sustains. bench/machine_speed.py measures how steady both are (docs/PERF.md).
CPU_TRIES = 15         # tries of the compute workload (~50 ms each)
DISK_TRIES = 5         # tries of the disk probe, each DISK_MIB of random experts' parts
DISK_MIB = 64
DISK_THREADS = 4       # readers of the disk probe (the engine's default SDQ_IO_THREADS)
# How far two probes of one unchanged machine disagree on the tok/s they predict: the 95th
# percentile of 870 ordered pairs of 30 probes on the 2-vCPU dev VM was x1.052, the 5th
# x0.950 (docs/PERF.md, docs/perf-data/machine_speed_20261205.jsonl)
PROBE_NOISE = 0.05


def cpu_ms() -> float:
    """Milliseconds of a fixed single-threaded workload, the fastest of CPU_TRIES:
    interpreted integer work and float32 dot products on a 4 MiB array (what the Python
    engine's decode step is made of)."""
    a = np.linspace(0.0, 1.0, 1 << 20, dtype=np.float32)
    times = []
    for _ in range(CPU_TRIES):
        t0 = time.perf_counter()
        acc = 0
        for i in range(1_000_000):
            acc += i * i % 7
        for _ in range(150):
            acc += int(np.dot(a, a))
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def disk_mib_s(model: str | os.PathLike, threads: int = DISK_THREADS, n_reads: int | None = None,
               seed: int = 0) -> dict:
    """The disk's throughput for the engine's reads: random experts' parts (n_reads experts,
    or as many as make DISK_MIB), each its 4096-aligned window read with O_DIRECT (buffered
    where the file system refuses), from `threads` threads, the page cache dropped first."""
    mf = ModelFile(model)
    size = os.path.getsize(model)
    rng = random.Random(seed)
    windows: list[tuple[int, int]] = []
    experts = total = 0
    while experts < n_reads if n_reads else total < DISK_MIB * 2**20:
        layer, expert = rng.randrange(mf.hp.n_layer), rng.randrange(mf.hp.n_expert)
        experts += 1
        for part in EXPERT_PARTS:
            r = mf.expert_range(layer, expert, part)
            lo, hi = r.offset // 4096 * 4096, -(-(r.offset + r.n_bytes) // 4096) * 4096
            windows.append((lo, min(hi - lo, (size - lo) // 4096 * 4096)))
            total += windows[-1][1]
    drop_page_cache(model)
    try:
        fd, direct = os.open(model, os.O_RDONLY | os.O_DIRECT), True
    except OSError:
        fd, direct = os.open(model, os.O_RDONLY), False
    todo = list(windows)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def reader():
        buf = mmap.mmap(-1, max(n for _, n in windows))   # page-aligned, as O_DIRECT needs
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    off, n = todo.pop()
                got = os.preadv(fd, [memoryview(buf)[:n]], off)
                if got != n:
                    raise OSError(f"{model}: read {got} of {n} bytes at offset {off}")
        except BaseException as e:   # a reader that dies must not leave a throughput of fewer bytes
            errors.append(e)
    pool = [threading.Thread(target=reader) for _ in range(max(1, threads))]
    try:
        t0 = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
    if errors:
        raise errors[0]
    return {"mb_per_s": total / 2**20 / seconds, "read_bytes": total, "reads": len(windows),
            "expert_bytes": mf.expert_bytes(0), "threads": threads, "o_direct": direct}


def machine_speed(model: str | os.PathLike) -> dict:
    """This machine's speed now, as golden timing records it."""
    disk = statistics.median(disk_mib_s(model, seed=k)["mb_per_s"] for k in range(DISK_TRIES))
    return {"cpu_ms": round(cpu_ms(), 3), "disk_mib_s": round(disk, 1)}


def machine_factor(then: dict, now: dict, io_share: float) -> tuple[float, str]:
    """(the decode tok/s the machine alone predicts now, relative to then; how). A decode step
    is compute plus waiting for reads (`io_share` of its time when golden was timed): the
    compute part scales with the CPU workload's time, the waiting part with the disk's
    throughput."""
    cpu = now["cpu_ms"] / then["cpu_ms"]                   # > 1: the CPU is slower now
    disk = then["disk_mib_s"] / now["disk_mib_s"]          # > 1: the disk is slower now
    s = min(max(io_share, 0.0), 1.0)
    factor = 1.0 / ((1.0 - s) * cpu + s * disk)
    how = (f"this machine's CPU workload takes x{cpu:.3f} the time it took when golden was timed "
           f"({now['cpu_ms']:.1f} vs {then['cpu_ms']:.1f} ms), its disk reads at x{1 / disk:.3f} the speed "
           f"({now['disk_mib_s']:.0f} vs {then['disk_mib_s']:.0f} MiB/s); with {100 * s:.0f} % of decode "
           f"spent waiting for reads then, that predicts tok/s x{factor:.3f}")
    return factor, how


def explains(then: dict, now: dict, io_share: float, ratio: float, min_effect: float) -> tuple[bool, float, str]:
    """Does the machine's own slowdown explain a tok/s ratio (now/golden) below 1 - min_effect?
    The machine is credited only with the part of its slowdown beyond the probes' own noise
    (PROBE_NOISE): yes when the ratio, divided by that credit, is within min_effect.
    (explained, the machine's factor, how)."""
    factor, how = machine_factor(then, now, io_share)
    credit = min(1.0, factor * (1.0 + PROBE_NOISE))
    how += f"; beyond the probes' own noise (+-{PROBE_NOISE:.0%}) that is x{credit:.3f}"
    return ratio / credit >= 1.0 - min_effect, factor, how


def io_wait_share(decode_stats: list[dict]) -> float | None:
    """Median share of decode time spent waiting for expert reads (stats io_wait_s /
    seconds) over runs; None when the engine does not report it."""
    shares = [float(d["io_wait_s"]) / float(d["seconds"]) for d in decode_stats
              if d.get("io_wait_s") is not None and float(d.get("seconds") or 0) > 0]
    return round(statistics.median(shares), 4) if shares else None
