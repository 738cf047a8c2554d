"""The arena where the eviction order decides (epmci/check/order_arena.py): chosen on a run's
routing so that a cache with another order than the contract's LRU counts differently, and
none claimed where the routing leaves the order nothing to decide."""

from __future__ import annotations

import random
from types import SimpleNamespace

from epmci.check.order_arena import ALTERNATIVES, order_arena, spread
from epmci.contract.cache_model import CacheModel, Lookup


def facts(n_layer: int, n_expert: int, used: int) -> SimpleNamespace:
    return SimpleNamespace(n_layer=n_layer, n_expert=n_expert, n_expert_used=used, expert_bytes=[100] * n_layer)


def all_experts_trace(n_layer: int, n_expert: int, tokens: int, seed: int = 0) -> list[Lookup]:
    """Every token uses every expert, in a first-use order the router's ranking gives."""
    rnd = random.Random(seed)
    return [Lookup("prefill" if t < tokens // 2 else "decode", il, rnd.sample(range(n_expert), n_expert), batch=t)
            for t in range(tokens) for il in range(n_layer)]


def counters(model: type[CacheModel], f, slots: int, trace: list[Lookup]) -> dict:
    run = model([0, slots], [1] * f.n_layer, f.expert_bytes, need=f.n_expert).run(trace)
    return {ph: c.as_dict() for ph, c in run.items()}


def test_all_experts_in_whole_layer_classes_count_the_same_under_any_order():
    """Why the choice is needed: two layers in a class of their own, every expert used by
    every token -- how many of a layer's experts survive does not depend on which."""
    f, trace = facts(2, 8, 8), all_experts_trace(2, 8, 12)
    for slots in range(8, 16):
        want = counters(CacheModel, f, slots, trace)
        assert all(counters(alt, f, slots, trace) == want for alt in ALTERNATIVES.values()), slots


def test_on_three_all_experts_layers_the_chosen_arena_tells_every_alternative():
    f, trace = facts(3, 8, 8), all_experts_trace(3, 8, 12)
    got = order_arena(f, trace, batch=4, max_slots=None)
    assert got.tried == (8, 23) and got.slots is not None and 8 <= got.slots <= 23
    assert set(got.told) == set(ALTERNATIVES)
    want = counters(CacheModel, f, got.slots, trace)
    assert all(counters(alt, f, got.slots, trace) != want for alt in ALTERNATIVES.values())


def test_the_memory_bounds_the_arenas_tried():
    f, trace = facts(3, 8, 8), all_experts_trace(3, 8, 12)
    got = order_arena(f, trace, batch=4, max_slots=12)
    assert got.tried == (8, 12) and (got.slots is None or got.slots <= 12)


def test_a_routing_that_leaves_the_order_nothing_to_decide_chooses_none_and_says_why():
    """The same two experts every token, one layer: once read they stay, nothing is evicted."""
    f = facts(1, 4, 2)
    trace = [Lookup("decode", 0, [0, 1], batch=t) for t in range(10)]
    got = order_arena(f, trace, batch=1, max_slots=None)
    assert got.slots is None and got.told == ()
    assert "no uniform arena of 2 to 3 slots makes the eviction order change a counter" in got.reason()


def test_spread_keeps_both_ends_and_at_most_n():
    assert spread(3, 5, 32) == [3, 4, 5]
    s = spread(8, 10239, 32)
    assert s[0] == 8 and s[-1] == 10239 and len(s) == 32 == len(set(s))
