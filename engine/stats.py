"""Per-phase stats records (docs/engine-contract.md, "Stats") and the process's memory
figures from /proc/self/status."""

from __future__ import annotations

from dataclasses import dataclass, field

# Counters that are exact: the same for the same inputs on every run, thread count and
# machine. A phase's value is the difference of two snapshots of ExpertStore.counters().
EXACT_COUNTERS = ("hits", "misses", "evictions", "ssd_bytes", "io_bytes", "prefetch_issued", "prefetch_used")
# Branch events: how often each paging switch's own code path ran (docs/engine-contract.md,
# Stats), exact counters too, in the order the record lists them.
BRANCH_EVENTS = ("transient_reads", "pinned_hits", "prefetch_predictions", "prefetch_layers_ahead",
                 "prefetch_queued", "prefetch_late", "prefetch_dropped", "prefetch_stale", "serial_reads",
                 "fadvise_ranges")


def proc_status_kib(key: str) -> int:
    """A `key:  N kB` field of /proc/self/status, in KiB (0 where /proc is not available)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mb() -> float:
    return proc_status_kib("VmHWM") / 1024.0


def vm_swap_mb() -> float:
    return proc_status_kib("VmSwap") / 1024.0


def rss_bytes() -> int:
    """VmRSS: the interpreter, NumPy, numba and whatever is touched so far."""
    return proc_status_kib("VmRSS") * 1024


@dataclass
class PhaseStats:
    phase: str
    tokens: int = 0
    seconds: float = 0.0
    counters: dict = field(default_factory=dict)

    def record(self) -> dict:
        rec = {"phase": self.phase, "tokens": self.tokens, "seconds": round(self.seconds, 6),
               "tok_s": round(self.tokens / self.seconds, 4) if self.seconds > 0 else 0.0}
        rec.update(self.counters)
        rec["peak_rss_mb"] = round(peak_rss_mb(), 1)
        rec["vm_swap_mb"] = round(vm_swap_mb(), 1)
        return rec


def phase_counters(prev: dict, before: dict, after: dict, phase_tokens: int) -> dict:
    """A phase's stats fields: `prev` (the phase so far) plus the counters between the
    snapshots `before` and `after`. Empty snapshots (--no-pager) give zeros."""
    rec = {}
    for k in EXACT_COUNTERS + BRANCH_EVENTS:
        rec[k] = int(prev.get(k, 0)) + int(after.get(k, 0)) - int(before.get(k, 0))
    lookups = rec["hits"] + rec["misses"]
    out = {
        "hit_rate": round(100.0 * rec["hits"] / lookups, 4) if lookups else 0.0,
        "hits": rec["hits"],
        "misses": rec["misses"],
        "evictions": rec["evictions"],
        "ssd_bytes": rec["ssd_bytes"],
        "ssd_bytes_per_token": round(rec["ssd_bytes"] / phase_tokens, 3) if phase_tokens else 0.0,
        "io_bytes": rec["io_bytes"],
        "n_slots": int(after.get("n_slots", 0)),
        "n_slots_small": int(after.get("n_slots_small", 0)),
        "n_slots_large": int(after.get("n_slots_large", 0)),
        "prefetch_issued": rec["prefetch_issued"],
        "prefetch_used": rec["prefetch_used"],
        "prefetch_used_rate": (round(100.0 * rec["prefetch_used"] / rec["prefetch_issued"], 4)
                               if rec["prefetch_issued"] else 0.0),
        "io_wait_s": round(float(prev.get("io_wait_s", 0.0)) + float(after.get("io_wait_s", 0.0))
                           - float(before.get("io_wait_s", 0.0)), 6),
        "io_direct_pct": float(after.get("io_direct_pct", 0.0)),
        "arena_mb": after.get("arena_mb", 0.0),
        "ram_need_mb": after.get("ram_need_mb", 0.0),
    }
    out.update((k, rec[k]) for k in BRANCH_EVENTS)
    return out
