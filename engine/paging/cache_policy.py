"""The arena's cache policy: which (layer, expert) sits in which slot, and what is evicted.

Pure logic (no I/O, no threads), so every decision is a function of the sequence of calls
alone: the pager calls it on the main thread, in a deterministic order, when it *issues*
reads -- never when a read completes. That is what makes the exact counters exact.

* One LRU per slot class; an expert only goes into a slot of its layer's class.
* Demand lookups (`lookup`): hits are found (and protected) first, then each miss takes a
  free slot or evicts its class's least recently used entry that this lookup does not
  need. `admit_min_hits=N`: a miss is admitted to a slot only once the (layer, expert)
  has been looked up N times (this lookup included); before that it is computed from a
  transient buffer (slot -1) and nothing is evicted.
* Pins (`pin`): never evicted; at most `n_slots - need` per class, so a layer of one
  micro-batch always fits beside them.
* Prefetch (`prefetch`): takes a free slot or evicts the least recently used entry that is
  not of the current layer, not in use by the batch being computed, not itself an
  unconsumed prefetch and not in `protect` (the prediction being issued). It only
  prefetches experts that would be admitted at their next lookup. A prefetch is
  *outstanding* from issue until a lookup consumes it (prefetch_used), it is evicted, or
  it goes stale (`drop_stale`).
* `simulate_belady`: the offline optimal (MIN) policy on a lookup trace, for the bench.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

Key = tuple[int, int]   # (layer, expert)


@dataclass(frozen=True)
class Decision:
    key: Key
    hit: bool
    slot: int                  # -1: transient buffer (not admitted)
    victim: Key | None = None  # entry evicted to make room
    prefetched: bool = False   # hit on an outstanding prefetch (prefetch used)


class CachePolicy:
    def __init__(self, n_slots: tuple[int, ...] | list[int], class_of_layer: tuple[int, ...] | list[int],
                 admit_min_hits: int = 1, need: tuple[int, ...] | list[int] | None = None):
        self.n_slots = tuple(int(n) for n in n_slots)
        self.class_of_layer = tuple(int(c) for c in class_of_layer)
        self.admit_min_hits = max(1, int(admit_min_hits))
        self.need = tuple(need) if need is not None else tuple(0 for _ in self.n_slots)
        first = 0
        self.free: list[deque[int]] = []
        self.slot_class: list[int] = []
        for k, n in enumerate(self.n_slots):
            self.free.append(deque(range(first, first + n)))
            self.slot_class += [k] * n
            first += n
        self.owner: list[Key | None] = [None] * first
        self.lru: list[OrderedDict[Key, int]] = [OrderedDict() for _ in self.n_slots]
        self.where: dict[Key, int] = {}
        self.pinned: dict[Key, int] = {}
        self.in_use: set[Key] = set()
        self.outstanding: dict[Key, int] = {}   # prefetched, not consumed -> birth clock
        self.seen: Counter[Key] = Counter()
        self.hits = self.misses = self.evictions = 0
        self.prefetch_issued = self.prefetch_used = 0
        # branch events: what the admission and pin switches exist for
        self.transient_reads = self.pinned_hits = 0

    # ------------------------------------------------------------ queries

    def cls(self, key: Key) -> int:
        return self.class_of_layer[key[0]]

    def resident(self, key: Key) -> bool:
        return key in self.where

    # ------------------------------------------------------------ slots

    def _take(self, k: int, eligible) -> tuple[int, Key | None] | None:
        if self.free[k]:
            return self.free[k].popleft(), None
        for key in self.lru[k]:
            if eligible(key):
                slot = self.lru[k].pop(key)
                del self.where[key]
                self.outstanding.pop(key, None)   # evicted before use: not a used prefetch
                self.owner[slot] = None
                self.evictions += 1
                return slot, key
        return None

    def _place(self, key: Key, slot: int, pinned: bool = False) -> None:
        self.where[key] = slot
        self.owner[slot] = key
        if pinned:
            self.pinned[key] = slot
        else:
            self.lru[self.cls(key)][key] = slot

    def touch(self, key: Key) -> None:
        lru = self.lru[self.cls(key)]
        if key in lru:
            lru.move_to_end(key)

    # ------------------------------------------------------------ demand

    def lookup(self, layer: int, experts: list[int]) -> list[Decision]:
        """One micro-batch's distinct routed experts of a layer (first-use order).

        Every returned slot stays in use (not evictable) until `release`."""
        keys = [(layer, int(e)) for e in experts]
        hit: dict[Key, Decision] = {}
        for key in keys:
            self.seen[key] += 1
            if key in self.where:
                self.hits += 1
                self.pinned_hits += key in self.pinned
                used = self.outstanding.pop(key, None) is not None
                if used:
                    self.prefetch_used += 1
                self.touch(key)
                self.in_use.add(key)
                hit[key] = Decision(key, True, self.where[key], None, used)
        out = []
        k = self.class_of_layer[layer]
        for key in keys:
            d = hit.get(key)
            if d is None:
                self.misses += 1
                if self.seen[key] >= self.admit_min_hits:
                    taken = self._take(k, lambda v: v not in self.in_use)
                    if taken is None:  # cannot happen while n_slots - pins >= need
                        raise RuntimeError(f"no evictable slot of class {k} for {key}")
                    slot, victim = taken
                    self._place(key, slot)
                    self.in_use.add(key)
                    d = Decision(key, False, slot, victim)
                else:
                    self.transient_reads += 1
                    d = Decision(key, False, -1)
            out.append(d)
        return out

    def release(self) -> None:
        self.in_use.clear()

    def force_admit(self, key: Key) -> None:
        """The next lookup of key admits it to a slot whatever admit_min_hits says (the
        selftest computes from a slot)."""
        self.seen[key] = max(self.seen[key], self.admit_min_hits - 1)

    # ------------------------------------------------------------ pins

    def pin(self, keys: list[Key]) -> list[tuple[Key, int]]:
        """Pin keys in order while each class keeps `need` unpinned slots. Returns (key, slot)."""
        done = []
        n_pinned = [0] * len(self.n_slots)
        for p in self.pinned:
            n_pinned[self.cls(p)] += 1
        for key in keys:
            if key in self.where:
                continue
            k = self.cls(key)
            if n_pinned[k] >= self.n_slots[k] - self.need[k] or not self.free[k]:
                continue
            n_pinned[k] += 1
            slot = self.free[k].popleft()
            self._place(key, slot, pinned=True)
            done.append((key, slot))
        return done

    # ------------------------------------------------------------ prefetch

    def admissible(self, key: Key) -> bool:
        """Would the next lookup of key admit it to a slot?"""
        return self.seen[key] + 1 >= self.admit_min_hits

    def prefetch(self, key: Key, current_layer: int, clock: int,
                 protect: set[Key] | frozenset = frozenset()) -> Decision | None:
        """Issue a prefetch of key into a slot of its class, or None (resident, not
        admissible, or no slot may be evicted)."""
        if key in self.where or not self.admissible(key):
            return None
        taken = self._take(self.cls(key), lambda v: v[0] != current_layer and v not in self.in_use
                           and v not in self.outstanding and v not in protect)
        if taken is None:
            return None
        slot, victim = taken
        self._place(key, slot)
        self.outstanding[key] = clock
        self.prefetch_issued += 1
        return Decision(key, False, slot, victim)

    def drop_stale(self, clock: int, max_age: int) -> list[Key]:
        """Outstanding prefetches older than max_age tokens stop being outstanding (their
        bytes stay cached as ordinary entries)."""
        stale = [k for k, born in self.outstanding.items() if clock - born > max_age]
        for k in stale:
            del self.outstanding[k]
        return stale

    def counters(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "prefetch_issued": self.prefetch_issued, "prefetch_used": self.prefetch_used,
                "transient_reads": self.transient_reads, "pinned_hits": self.pinned_hits}


# ---------------------------------------------------------------- offline optimal

def simulate_belady(groups: list[tuple[int, list[int]]], class_of_layer, n_slots) -> list[list[bool]]:
    """Belady's MIN on a lookup trace: on a miss with the class full, evict the entry whose
    next use is furthest in the future (never one of the current group: a layer's experts
    of one micro-batch are resident together). Every miss is admitted, as with
    admit_min_hits=1. Returns hit flags per group, aligned with each group's experts.
    """
    INF = float("inf")
    n = len(groups)
    nxt: list[dict[Key, float]] = [dict() for _ in range(n)]
    last: dict[Key, float] = {}
    for g in range(n - 1, -1, -1):
        layer, experts = groups[g]
        for e in experts:
            key = (layer, int(e))
            nxt[g][key] = last.get(key, INF)
        for e in experts:
            last[(layer, int(e))] = g
    cache: list[dict[Key, float]] = [dict() for _ in n_slots]   # key -> next use
    out = []
    for g, (layer, experts) in enumerate(groups):
        k = class_of_layer[layer]
        c = cache[k]
        keys = [(layer, int(e)) for e in experts]
        flags = [key in c for key in keys]
        group = set(keys)
        for key, h in zip(keys, flags):
            if not h and len(c) >= n_slots[k]:
                victim = max((v for v in c if v not in group), key=lambda v: (c[v], v))
                del c[victim]
            c[key] = nxt[g][key]
        out.append(flags)
    return out
