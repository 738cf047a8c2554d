"""Exact counters of two runs compared: one representation ({phase: {field: value}}, as
contract.outputs.counters_of reads them) and one diff, with the direction of each change."""

from __future__ import annotations

from dataclasses import dataclass

PHASES = ("prefill", "decode")
MISSING = "<missing>"
# Direction of a counter change: fewer reads and misses, more hits are better. Any counter
# not listed (tokens, slots, arena size, ...) is neutral: a change is just a change.
LOWER_IS_BETTER = frozenset({"misses", "evictions", "ssd_bytes", "ssd_bytes_per_token", "prefetch_issued"})
HIGHER_IS_BETTER = frozenset({"hits", "prefetch_used", "hit_rate", "prefetch_used_rate"})


@dataclass
class CounterChange:
    key: str              # phase.field
    before: object        # the reference side (golden, the first run); MISSING if absent
    after: object
    kind: str             # worse | better | changed

    def text(self, sep: str = "->") -> str:
        a, b = self.before, self.after
        rel = ""
        if sep == "->" and isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
            rel = f" ({(b - a) / abs(a) * 100:+.1f}%)"
        return f"{self.key} {a} {sep} {b}{rel}"


def _direction(field: str, a, b) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if field in LOWER_IS_BETTER:
            return "worse" if b > a else "better"
        if field in HIGHER_IS_BETTER:
            return "worse" if b < a else "better"
    return "changed"


def counter_changes(before: dict, after: dict) -> list[CounterChange]:
    """Every counter that differs between two {phase: {field: value}} maps, in phase order,
    then in the fields' order."""
    out = []
    for phase in sorted(set(before) | set(after), key=lambda p: (PHASES + (p,)).index(p)):
        a, b = before.get(phase, {}), after.get(phase, {})
        for k in list(a) + [k for k in b if k not in a]:
            av, bv = a.get(k, MISSING), b.get(k, MISSING)
            if av != bv:
                out.append(CounterChange(f"{phase}.{k}", av, bv, _direction(k, av, bv)))
    return out


def n_counters(counters: dict) -> int:
    return sum(len(fields) for fields in counters.values())


def miss_rate(c: dict) -> float:
    n = c.get("hits", 0) + c.get("misses", 0)
    return 100.0 * c.get("misses", 0) / n if n else 0.0


def io_diagnosis(before: dict, after: dict) -> tuple[bool, str]:
    """Did the decode phase's I/O move between two runs (bytes/token or miss rate)? The
    counters are exact, so any change is real. `before`/`after` are decode stats records."""
    if not before or not after:
        return False, "no decode counters to tell an I/O regression from compute"
    b0, b1 = before.get("ssd_bytes_per_token", 0), after.get("ssd_bytes_per_token", 0)
    m0, m1 = miss_rate(before), miss_rate(after)
    if b0 != b1 or before.get("misses") != after.get("misses") or before.get("hits") != after.get("hits"):
        rel = f"{(b1 - b0) / b0 * 100:+.1f}%" if b0 else f"{b0} -> {b1}"
        return True, (f"I/O moved too: SSD bytes/token {rel} ({b0 / 2**20:.3f} -> {b1 / 2**20:.3f} MiB), "
                      f"miss rate {m0:.1f}% -> {m1:.1f}%: an I/O regression")
    return False, (f"bytes/token ({b0 / 2**20:.3f} MiB) and miss rate ({m0:.1f}%) unchanged: "
                   f"not I/O -- compute, or noise")
