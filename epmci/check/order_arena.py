"""An arena where the cache's eviction order decides the counters, chosen on a run's own routing.

The counters check (cache_check.py) holds a run to the contract's LRU exactly, but a wrong
order is only visible where the order changes a count. Where a class holds whole layers of a
model whose tokens use every expert, which of a layer's experts survive does not change how
many do: a cache that never refreshes an entry on a hit counts exactly as LRU (measured:
a 3-layer all-experts model passed that fault in every run of the check), and no setting
derived from the model's facts alone says where the order starts to count -- the routing does.

A run's routing does not depend on its arena, so the default switch run's MoE dump is replayed
under the contract's policy and under its nearest alternatives (ALTERNATIVES) in uniform
arenas (one class: every layer's experts compete, so the order across layers decides too) from
the micro-batch's need to one slot short of every expert, and the run is made in the arena
where the most alternatives count differently (then: where they differ the most).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ..contract.cache_model import CacheModel, Key, Lookup
from ..gguf.facts import ModelFacts

CANDIDATES = 32          # arenas replayed at most (spread evenly over the range): each replay is cheap,
                         # a production model's range has thousands of sizes


class NoRefresh(CacheModel):
    """A used entry keeps its place: evictions go in the order entries came in (FIFO)."""
    @staticmethod
    def refresh(lru: OrderedDict, key: Key) -> None:
        pass


class EvictNewest(CacheModel):
    """The most recently used eligible entry is evicted (MRU)."""
    @staticmethod
    def victim(lru: OrderedDict, eligible) -> Key | None:
        return next((v for v in reversed(lru) if eligible(v)), None)


ALTERNATIVES = {"a hit does not make its entry recent": NoRefresh, "the newest entry is evicted": EvictNewest}


@dataclass(frozen=True)
class OrderArena:
    """The uniform arena chosen (slots None: none in the range tried makes the order count)."""
    slots: int | None
    told: tuple[str, ...]         # the alternatives whose counters differ from the policy's there
    tried: tuple[int, int]        # the range of slot counts replayed

    def reason(self) -> str:
        lo, hi = self.tried
        return (f"on this run's routing no uniform arena of {lo} to {hi} slots makes the eviction order change a "
                f"counter: {' and '.join(ALTERNATIVES)} count as the contract's LRU does")


def spread(lo: int, hi: int, n: int) -> list[int]:
    """Up to n distinct integers from lo to hi, both included, evenly spaced."""
    if hi - lo + 1 <= n:
        return list(range(lo, hi + 1))
    return sorted({lo + round(i * (hi - lo) / (n - 1)) for i in range(n)})


def order_arena(facts: ModelFacts, lookups: list[Lookup], batch: int, max_slots: int | None) -> OrderArena:
    """The uniform slot count (<= max_slots, the memory's) in which the alternatives' counters
    differ most from the contract's policy on `lookups` (admission on first use, no pins, no
    prefetch: the run is made so)."""
    need = min(facts.n_expert, batch * facts.n_expert_used)
    hi = facts.n_expert * facts.n_layer - 1
    if max_slots is not None:
        hi = min(hi, max_slots)
    best, score = None, (0, 0)
    for n in spread(need, hi, CANDIDATES):
        def counters(model: type[CacheModel]) -> dict[str, dict]:
            run = model([0, n], [1] * facts.n_layer, facts.expert_bytes, need).run(lookups)
            return {ph: c.as_dict() for ph, c in run.items()}
        want = counters(CacheModel)
        got = {name: counters(alt) for name, alt in ALTERNATIVES.items()}
        told = tuple(name for name, c in got.items() if c != want)
        differ = sum(abs(c[ph]["evictions"] - want[ph]["evictions"]) + abs(c[ph]["hits"] - want[ph]["hits"])
                     for c in got.values() for ph in want)
        if (len(told), differ) > score:
            best, score = OrderArena(n, told, (need, hi)), (len(told), differ)
    return best or OrderArena(None, (), (need, hi))
