"""Unit tests of the pager's pure logic: cache policy, prefetch queue, slot planning, Belady.

No model, no I/O: engine/paging/cache_policy.py, engine/paging/prefetch.py (PrefetchQueue) and
engine/paging/arena.py (plan_slots) are functions of their call sequence alone.
"""

from __future__ import annotations

import itertools
import random

import pytest

from engine.paging.arena import LayerLayout, PartLayout, plan_slots
from engine.paging.cache_policy import CachePolicy, simulate_belady
from engine.gguf_model import ModelError
from engine.paging.prefetch import PrefetchQueue
from epmci.contract.cache_model import CacheModel, Lookup


def one_class(n_slots, n_layers=4, admit=1, need=0):
    return CachePolicy([n_slots], [0] * n_layers, admit, [need])


# ---------------------------------------------------------------- LRU

def test_lru_evicts_least_recently_used():
    p = one_class(3)
    for e in (1, 2, 3):
        p.lookup(0, [e]); p.release()
    p.lookup(0, [1]); p.release()            # 1 becomes most recent
    [d] = p.lookup(0, [4]); p.release()
    assert (d.hit, d.victim) == (False, (0, 2))
    assert (p.hits, p.misses, p.evictions) == (1, 4, 1)
    victims = []
    for e in (5, 6, 7):                      # further misses evict in LRU order: 3, 1, 4
        [d] = p.lookup(0, [e]); p.release()
        victims.append(d.victim)
    assert victims == [(0, 3), (0, 1), (0, 4)]


def test_lookup_never_evicts_an_expert_of_the_same_group():
    p = one_class(2)
    p.lookup(0, [1]); p.release()
    p.lookup(0, [2]); p.release()            # LRU order: 1, 2
    ds = p.lookup(0, [3, 1])                 # 1 is a hit of this group: 3 must evict 2
    assert [d.hit for d in ds] == [False, True]
    assert ds[0].victim == (0, 2)
    assert {p.owner[d.slot] for d in ds} == {(0, 3), (0, 1)}


def test_in_use_slots_are_not_evicted_until_release():
    p = one_class(2)
    p.lookup(0, [1, 2])
    with pytest.raises(RuntimeError):
        p.lookup(1, [3])                     # both slots are in use by the unreleased batch
    p2 = one_class(2)
    p2.lookup(0, [1, 2]); p2.release()
    [d] = p2.lookup(1, [3])
    assert d.victim == (0, 1)


def test_classes_are_separate():
    p = CachePolicy([2, 1], [0, 1, 0], 1, [1, 1])
    p.lookup(1, [7]); p.release()
    [d] = p.lookup(1, [8]); p.release()
    assert d.victim == (1, 7) and d.slot == 2            # class 1 owns slot 2 only
    for e in range(5):
        [d] = p.lookup(0, [e]); p.release()
        assert d.slot in (0, 1)
    [d] = p.lookup(1, [8])
    assert d.hit and d.slot == 2


# ---------------------------------------------------------------- admission

def test_admit_min_hits_computes_early_misses_from_a_transient_buffer():
    p = one_class(2, admit=2)
    p.lookup(0, [1]); p.release()
    p.lookup(0, [2]); p.release()
    assert p.where == {} and p.misses == 2
    [d] = p.lookup(0, [1]); p.release()          # second sighting: admitted
    assert d.slot >= 0 and not d.hit and p.resident((0, 1))
    [d] = p.lookup(0, [3]); p.release()          # first sighting of 3: not admitted, evicts nothing
    assert d.slot == -1 and p.evictions == 0
    [d] = p.lookup(0, [1]); p.release()
    assert d.hit


def test_prefetch_only_targets_admissible_experts():
    p = one_class(4, admit=2)
    assert p.prefetch((1, 5), current_layer=0, clock=0) is None     # never seen
    p.lookup(1, [5]); p.release()                                   # seen once: next lookup admits
    d = p.prefetch((1, 5), current_layer=0, clock=0)
    assert d is not None and p.outstanding == {(1, 5): 0}


# ---------------------------------------------------------------- pins

def test_hot_pins_are_never_evicted():
    p = one_class(4, need=2)
    pinned = p.pin([(0, 9), (1, 9), (2, 9)])     # at most 4 - need = 2
    assert [k for k, _ in pinned] == [(0, 9), (1, 9)]
    rng = random.Random(0)
    for i in range(200):
        layer = i % 4
        p.lookup(layer, rng.sample(range(8), 2)); p.release()
        for l2 in range(4):
            p.prefetch((l2, rng.randrange(8)), current_layer=layer, clock=i)
        p.drop_stale(i, 1)
    for key, slot in pinned:
        assert p.owner[slot] == key and key not in p.lru[0]
    assert p.lookup(0, [9])[0].hit


# ---------------------------------------------------------------- prefetch

def test_prefetch_never_evicts_the_current_layers_experts():
    p = one_class(4)
    p.lookup(0, [1, 2]); p.release()         # oldest: layer 0 (the current layer below)
    p.lookup(1, [1, 2]); p.release()
    d = p.prefetch((1, 3), current_layer=0, clock=0)
    assert d.victim == (1, 1)                # skips (0, 1), (0, 2)
    d = p.prefetch((1, 4), current_layer=0, clock=0)
    assert d.victim == (1, 2)
    # Only layer 0 entries and outstanding prefetches left: the prefetch is declined.
    assert p.prefetch((1, 5), current_layer=0, clock=0) is None
    assert p.resident((0, 1)) and p.resident((0, 2))
    assert p.prefetch_issued == 2 and p.evictions == 2


def test_prefetch_never_evicts_in_use_outstanding_or_protected():
    p = one_class(3)
    p.lookup(2, [1]); p.release()
    p.lookup(2, [2]); p.release()
    p.lookup(3, [1])                          # in use (not released)
    assert p.prefetch((1, 7), current_layer=0, clock=0, protect={(2, 1)}).victim == (2, 2)
    # (2, 1) protected, (1, 7) outstanding, (3, 1) in use: nothing may go
    assert p.prefetch((1, 8), current_layer=0, clock=0, protect={(2, 1)}) is None


def test_prefetch_goes_to_its_own_class():
    p = CachePolicy([3, 2], [0, 1, 0, 1], 1, [1, 1])
    for layer in range(4):
        for e in range(3):
            d = p.prefetch((layer, e), current_layer=(layer + 3) % 4, clock=0)
            if d is not None:
                assert p.slot_class[d.slot] == p.class_of_layer[layer]
        p.drop_stale(10, 0)


def test_prefetch_used_and_unused_accounting():
    p = one_class(3)
    p.prefetch((1, 1), 0, clock=0)
    p.prefetch((1, 2), 0, clock=0)
    ds = p.lookup(1, [1, 5])
    assert ds[0].hit and ds[0].prefetched and p.prefetch_used == 1
    p.release()
    p.lookup(2, [6]); p.release()             # evicts (1, 2): issued, never used
    assert not p.resident((1, 2)) and p.prefetch_issued == 2 and p.prefetch_used == 1
    assert p.outstanding == {}


def test_stale_prefetches_stop_being_outstanding():
    p = one_class(4)
    p.prefetch((1, 1), 0, clock=0)
    p.prefetch((1, 2), 0, clock=1)
    assert p.drop_stale(2, 1) == [(1, 1)]     # age 2 > 1
    assert list(p.outstanding) == [(1, 2)] and p.resident((1, 1))
    d = p.lookup(1, [1])[0]
    assert d.hit and not d.prefetched and p.prefetch_used == 0


def test_prefetch_queue_cap_order_and_staleness():
    q = PrefetchQueue(cap=2, stale=1)
    outstanding = []
    q.add([(1, 1), (1, 2), (1, 3), (1, 2)], clock=0)     # duplicate ignored
    q.pump(lambda: len(outstanding), lambda k, c: outstanding.append(k))
    assert outstanding == [(1, 1), (1, 2)] and [k for k, _ in q.pending] == [(1, 3)]
    outstanding.pop(0)                        # one consumed
    q.add([(2, 1)], clock=1)
    q.pump(lambda: len(outstanding), lambda k, c: outstanding.append(k))
    assert outstanding == [(1, 2), (1, 3)] and [k for k, _ in q.pending] == [(2, 1)]
    q.drop_layer(2)
    assert not q.pending
    q.add([(3, 1)], clock=1)
    q.expire(2)
    assert [k for k, _ in q.pending] == [(3, 1)]
    q.expire(3)
    assert not q.pending


def test_declined_prefetch_is_not_counted():
    p = one_class(1)
    p.lookup(0, [1]); p.release()
    assert p.prefetch((1, 1), current_layer=0, clock=0) is None
    assert (p.prefetch_issued, p.evictions) == (0, 0)


# ---------------------------------------------------------------- slot planning

def layout(gate, up, down):
    parts, pos = [], 0
    for n in (gate, up, down):
        parts.append(PartLayout(pos, 0, n, 1, n, 0, n))   # exact reads
        pos += -(-n // 4096) * 4096
    return LayerLayout(tuple(parts), gate + up + down, pos, gate + up + down)


CI_LIKE = [layout(73728, 73728, 90112)] * 5 + [layout(73728, 73728, 107520)] + \
          [layout(73728, 73728, 90112)] + [layout(73728, 73728, 107520)]
S, L = 237568, 258048
MiB = 1 << 20


def test_slot_sizes_and_proportions():
    plan = plan_slots(CI_LIKE, 64, 4, 8, 30 * MiB, uniform=False)
    assert plan.class_sizes == (S, L) and plan.class_of_layer == (0, 0, 0, 0, 0, 1, 0, 1)
    assert plan.need == (32, 32) and plan.min_bytes == 32 * S + 32 * L
    n_small, n_large = plan.n_slots
    assert plan.total_bytes <= 30 * MiB and 30 * MiB - plan.total_bytes < S
    # 384 small and 128 large experts: 3 to 1, as far as the minimum allows
    assert abs(n_small / n_large - 3) < 0.2
    u = plan_slots(CI_LIKE, 64, 4, 8, 30 * MiB, uniform=True)
    assert u.class_sizes == (L,) and u.n_slots == (30 * MiB // L,) and u.need == (32,)


def test_large_minimum_dominates_small_arena():
    plan = plan_slots(CI_LIKE, 64, 4, 8, 16 * MiB, uniform=False)
    assert plan.n_slots[1] == 32 and plan.n_slots[0] >= 32


def test_minimum_arena_refused_with_the_number():
    with pytest.raises(ModelError) as ei:
        plan_slots(CI_LIKE, 64, 4, 8, 15 * MiB, uniform=False)
    msg = str(ei.value)
    assert "minimum 15.12 MiB" in msg and "32 large slots" in msg and "\n" not in msg
    with pytest.raises(ModelError, match=r"minimum 7\.88 MiB"):
        plan_slots(CI_LIKE, 64, 4, 8, 7 * MiB, uniform=True)
    # batch * k beyond the number of experts: capped at n_expert
    assert plan_slots(CI_LIKE, 64, 4, 32, 64 * MiB, uniform=True).need == (64,)


def test_never_more_slots_than_experts():
    plan = plan_slots(CI_LIKE, 64, 4, 1, 10_000 * MiB, uniform=False)
    assert plan.n_slots == (384, 128)


# ---------------------------------------------------------------- Belady

def _lru_hits(groups, cap):
    """LRU hits of one slot class of `cap` slots (epmci's model of the contract's policy)."""
    n_layer = max(layer for layer, _ in groups) + 1
    model = CacheModel([cap], [0] * n_layer, [0] * n_layer, need=0)
    return model.run([Lookup("run", layer, list(es)) for layer, es in groups])["run"].hits


def _opt_hits(seq, cap):
    """Brute force over every eviction choice (single accesses, one class)."""
    best = 0

    def go(i, cache, hits):
        nonlocal best
        if i == len(seq):
            best = max(best, hits)
            return
        k = seq[i]
        if k in cache:
            go(i + 1, cache, hits + 1)
        elif len(cache) < cap:
            go(i + 1, cache | {k}, hits)
        else:
            for v in cache:
                go(i + 1, (cache - {v}) | {k}, hits)

    go(0, frozenset(), 0)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_belady_is_optimal_on_small_traces(seed):
    rng = random.Random(seed)
    seq = [(0, rng.randrange(5)) for _ in range(11)]
    flags = simulate_belady([(l, [e]) for l, e in seq], [0], [3])
    assert sum(f[0] for f in flags) == _opt_hits(seq, 3)


def test_belady_beats_lru_and_respects_groups():
    rng = random.Random(1)
    groups = [(i % 4, rng.sample(range(12), 3)) for i in range(400)]
    flags = simulate_belady(groups, [0] * 4, [10])
    assert [len(f) for f in flags] == [3] * 400
    assert sum(map(sum, flags)) >= _lru_hits(groups, 10)
    # classes: a class-1 layer never competes with class-0 entries
    flags2 = simulate_belady([(0, [1]), (1, [1]), (0, [1]), (1, [2]), (0, [1])], [0, 1], [1, 1])
    assert [f[0] for f in flags2] == [False, False, True, False, True]


def test_belady_cyclic_scan():
    # cyclic access over cap + 1 keys: LRU never hits, MIN hits cap-1 of every cap
    seq = list(itertools.islice(itertools.cycle(range(5)), 50))
    flags = simulate_belady([(0, [e]) for e in seq], [0], [4])
    assert _lru_hits([(0, [e]) for e in seq], 4) == 0
    assert sum(f[0] for f in flags) >= 30
