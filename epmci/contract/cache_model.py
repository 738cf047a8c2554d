"""The counters docs/engine-contract.md promises for a paged run, computed from the routing
the engine itself dumped (and, with prefetch, the predictions it dumped) -- an independent
model of the contract's cache policy (Paging: Cache, Prefetch), so a cache, admission, pin or
prefetch-queue fault shows as counters that are not what the contract says they must be.

Per slot class one LRU. A micro-batch's lookup of a layer takes its distinct experts in
first-use order: hits first (each moved to most recent and protected), then each miss:
admitted only if this is at least the `admit_min_hits`-th lookup of that (layer, expert) --
then it takes a free slot or evicts the least recently used entry of its class that this
lookup does not use; not admitted, it is read into a transient buffer and evicts nothing.
Pins (from a --profile-out file, in its order) are loaded before the run, never evicted,
and skipped when their class would keep fewer than `need` unpinned slots or has no free
slot. Every miss reads the expert's bytes (pins are in no phase).

Prefetch (`Prefetch` settings and each layer start's predicted keys): at the start of layer
L the predicted experts already cached move to most recent, the others wait in a queue
(once each, with the token clock of the prediction that queued them); waiting ones are
issued in order while fewer than `queue` are outstanding -- each takes a free slot or
evicts the least recently used entry not of layer L, not outstanding and not in this
start's prediction, only if its next lookup would admit it; none qualifies: it is gone. A
lookup drops the waiting predictions for its layer and consumes outstanding ones it hits.
At a micro-batch's end the clock advances by its rows; predictions older than
`stale_tokens` are dropped (waiting) or stop being outstanding.

Without the predictions, what holds for any policy is a floor: `fewest_loads`, Belady's MIN
on the same lookups (no policy, prefetching or not, reads fewer experts into a class than
MIN does with its slots).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field, fields

Key = tuple[int, int]      # (layer, expert)


@dataclass
class Lookup:
    phase: str             # prefill | decode
    layer: int
    experts: list[int]     # distinct, in first-use order
    batch: int = 0         # the micro-batch it belongs to (run order)
    rows: int = 1          # that micro-batch's rows (tokens): the clock advances by them at its end


@dataclass(frozen=True)
class Prefetch:
    layer_ahead: int       # SDQ_PREFETCH_LAYER_AHEAD
    queue: int             # SDQ_PREFETCH_QUEUE
    stale_tokens: int      # SDQ_PREFETCH_STALE_TOKENS


@dataclass
class PhaseCounters:
    """One phase's exact counters, named as the stats name them."""
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    ssd_bytes: int = 0
    prefetch_issued: int = 0
    prefetch_used: int = 0
    transient_reads: int = 0
    pinned_hits: int = 0
    prefetch_predictions: int = 0
    prefetch_layers_ahead: int = 0
    prefetch_queued: int = 0
    prefetch_late: int = 0
    prefetch_dropped: int = 0
    prefetch_stale: int = 0
    reads: list[Key] = field(default_factory=list)   # every miss, in the order it is read

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "reads"}


COUNTERS = tuple(PhaseCounters().as_dict())


@dataclass
class CacheModel:
    n_slots: list[int]               # per class
    class_of_layer: list[int]
    expert_bytes: list[int]          # per layer: gate + up + down
    need: int                        # unpinned slots a class must keep (one layer's micro-batch)
    admit_min_hits: int = 1
    pins: list[Key] = field(default_factory=list)
    prefetch: Prefetch | None = None

    def run(self, lookups: list[Lookup], predicted: dict[tuple[int, int], list[Key]] | None = None
            ) -> dict[str, PhaseCounters]:
        """Counters per phase of `lookups` (in run order); with prefetch, `predicted`
        (micro-batch, layer) -> the keys predicted at that layer's start, as dumped."""
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
        outstanding: dict[Key, int] = {}                     # prefetched, not consumed -> clock of its prediction
        waiting: OrderedDict[Key, int] = OrderedDict()       # queued predictions -> clock
        counted_waiting: set[Key] = set()
        clock = 0
        out: dict[str, PhaseCounters] = {}

        def evict(k: int, eligible) -> bool:
            if free[k]:
                free[k] -= 1
                return True
            victim = self.victim(lru[k], eligible)
            if victim is None:
                return False
            del lru[k][victim]
            outstanding.pop(victim, None)
            c.evictions += 1
            return True

        def begin_layer(batch: int, layer: int) -> None:
            pf = self.prefetch
            protect: set[Key] = set()
            keys = (predicted or {}).get((batch, layer))
            if keys is not None:
                c.prefetch_predictions += 1
                c.prefetch_layers_ahead += pf.layer_ahead
                for key in keys:
                    protect.add(key)
                    cached = lru[self.class_of_layer[key[0]]]
                    if key in cached:
                        self.refresh(cached, key)             # predicted: away from the eviction end
                    elif key not in pinned and key not in waiting:
                        waiting[key] = clock
            while waiting and len(outstanding) < pf.queue:
                key, born = waiting.popitem(last=False)
                if key in counted_waiting:
                    counted_waiting.discard(key)
                    c.prefetch_late += 1
                k = self.class_of_layer[key[0]]
                if key in pinned or key in lru[k] or seen[key] + 1 < self.admit_min_hits:
                    continue
                if not evict(k, lambda v: v[0] != layer and v not in outstanding and v not in protect):
                    continue
                lru[k][key] = None
                outstanding[key] = born
                c.prefetch_issued += 1
                c.ssd_bytes += self.expert_bytes[key[0]]
            for key in waiting:
                if key not in counted_waiting:
                    counted_waiting.add(key)
                    c.prefetch_queued += 1

        def drop_waiting(keep) -> None:
            for key in [key for key, born in waiting.items() if not keep(key, born)]:
                del waiting[key]
                counted_waiting.discard(key)
                c.prefetch_dropped += 1

        for i, lk in enumerate(lookups):
            c = out.setdefault(lk.phase, PhaseCounters())
            if self.prefetch is not None:
                begin_layer(lk.batch, lk.layer)
                drop_waiting(lambda key, born: key[0] != lk.layer)
            k = self.class_of_layer[lk.layer]
            keys = [(lk.layer, e) for e in lk.experts]
            in_use = set()
            for key in keys:
                seen[key] += 1
                if key in pinned or key in lru[k]:
                    c.hits += 1
                    c.pinned_hits += key in pinned
                    if outstanding.pop(key, None) is not None:
                        c.prefetch_used += 1
                    if key in lru[k]:
                        self.refresh(lru[k], key)
                    in_use.add(key)
            for key in keys:
                if key in in_use:
                    continue
                c.misses += 1
                c.reads.append(key)
                c.ssd_bytes += self.expert_bytes[lk.layer]
                if seen[key] < self.admit_min_hits:
                    c.transient_reads += 1
                    continue                                  # transient buffer: nothing evicted
                evict(k, lambda v: v not in in_use)
                lru[k][key] = None
                in_use.add(key)
            if self.prefetch is not None and (i + 1 == len(lookups) or lookups[i + 1].batch != lk.batch):
                clock += lk.rows                              # the micro-batch's end
                drop_waiting(lambda key, born: clock - born <= self.prefetch.stale_tokens)
                for key in [key for key, born in outstanding.items() if clock - born > self.prefetch.stale_tokens]:
                    del outstanding[key]
                    c.prefetch_stale += 1
        return out

    # The two places the policy's order lives: alternatives (check/order_arena.py) override them.
    @staticmethod
    def refresh(lru: OrderedDict, key: Key) -> None:
        """A used entry becomes the most recent."""
        lru.move_to_end(key)

    @staticmethod
    def victim(lru: OrderedDict, eligible) -> Key | None:
        """The least recently used eligible entry."""
        return next((v for v in lru if eligible(v)), None)


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
