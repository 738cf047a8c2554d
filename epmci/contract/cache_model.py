"""The counters docs/engine-contract.md promises for a run without prefetch, computed from
the routing the engine itself dumped -- an independent model of the contract's cache policy
(Paging: Cache), so a cache, admission or pin fault shows as counters that are not what the
contract says they must be.

Per slot class one LRU. A micro-batch's lookup of a layer takes its distinct experts in
first-use order: hits first (each moved to most recent and protected), then each miss:
admitted only if this is at least the `admit_min_hits`-th lookup of that (layer, expert) --
then it takes a free slot or evicts the least recently used entry of its class that this
lookup does not use; not admitted, it is read into a transient buffer and evicts nothing.
Pins (from a --profile-out file, in its order) are loaded before the run, never evicted,
and skipped when their class would keep fewer than `need` unpinned slots or has no free
slot. Every miss reads the expert's bytes (pins are in no phase).

With prefetch on, the counters depend on predictions the dump does not hold; what holds
for any policy is a floor: `fewest_loads`, Belady's MIN on the same lookups (no policy,
prefetching or not, reads fewer experts into a class than MIN does with its slots).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

Key = tuple[int, int]      # (layer, expert)


@dataclass
class Lookup:
    phase: str             # prefill | decode
    layer: int
    experts: list[int]     # distinct, in first-use order


@dataclass
class PhaseCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    ssd_bytes: int = 0
    reads: list[Key] = field(default_factory=list)   # every miss, in the order it is read

    def as_dict(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "ssd_bytes": self.ssd_bytes}


@dataclass
class CacheModel:
    n_slots: list[int]               # per class
    class_of_layer: list[int]
    expert_bytes: list[int]          # per layer: gate + up + down
    need: int                        # unpinned slots a class must keep (one layer's micro-batch)
    admit_min_hits: int = 1
    pins: list[Key] = field(default_factory=list)

    def run(self, lookups: list[Lookup]) -> dict[str, PhaseCounters]:
        lru = [OrderedDict() for _ in self.n_slots]         # key -> None, least recent first
        free = list(self.n_slots)
        pinned: set[Key] = set()
        pins_per_class = [0] * len(self.n_slots)
        for key in self.pins:
            k = self.class_of_layer[key[0]]
            if key in pinned or pins_per_class[k] >= self.n_slots[k] - self.need or free[k] == 0:
                continue
            pinned.add(key)
            pins_per_class[k] += 1
            free[k] -= 1
        seen: Counter[Key] = Counter()
        out: dict[str, PhaseCounters] = {}
        for lk in lookups:
            c = out.setdefault(lk.phase, PhaseCounters())
            k = self.class_of_layer[lk.layer]
            keys = [(lk.layer, e) for e in lk.experts]
            in_use = set()
            for key in keys:
                seen[key] += 1
                if key in pinned or key in lru[k]:
                    c.hits += 1
                    if key in lru[k]:
                        lru[k].move_to_end(key)
                    in_use.add(key)
            for key in keys:
                if key in in_use:
                    continue
                c.misses += 1
                c.reads.append(key)
                c.ssd_bytes += self.expert_bytes[lk.layer]
                if seen[key] < self.admit_min_hits:
                    continue                                  # transient buffer: nothing evicted
                if free[k]:
                    free[k] -= 1
                else:
                    victim = next(v for v in lru[k] if v not in in_use)
                    del lru[k][victim]
                    c.evictions += 1
                lru[k][key] = None
                in_use.add(key)
        return out


def fewest_loads(lookups: list[Lookup], class_of_layer: list[int], n_slots: list[int]) -> list[int]:
    """Per slot class, the fewest experts any policy must read into it to serve `lookups`
    with that many slots: Belady's MIN (on a miss with the class full, evict the entry used
    again furthest in the future) on the lookups taken one expert at a time -- serving a
    micro-batch's experts together only constrains a policy more, so this stays a floor."""
    seq = [(lk.layer, e) for lk in lookups for e in lk.experts]
    INF = len(seq)
    nxt, last = [INF] * len(seq), {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i], last[seq[i]] = last.get(seq[i], INF), i
    cache: list[dict[Key, int]] = [dict() for _ in n_slots]   # key -> its next use
    loads = [0] * len(n_slots)
    for i, key in enumerate(seq):
        k = class_of_layer[key[0]]
        c = cache[k]
        if key not in c:
            loads[k] += 1
            if not n_slots[k]:
                continue
            if len(c) >= n_slots[k]:
                del c[max(c, key=c.__getitem__)]
        c[key] = nxt[i]
    return loads
