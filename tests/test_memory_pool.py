"""contract/memory.py: engine runs at once within the memory -- on synthetic figures (the
production model's two 7.6 GiB runs in an 8 GiB runner), and through a real check."""

from __future__ import annotations

import threading
import time

import pytest

from epmci.config.experiments import EXPERIMENTS, FIXED
from epmci.contract.memory import RUNTIME_MIB, RUNTIME_PER_TOKEN, MemoryPool, arena_room_mib, run_need_mib
from epmci.contract.runspec import RunSpec
from epmci.gguf.facts import ModelFacts
from epmci.units import MiB

GiB = 1 << 30
# prod35-full: 21.5 GB file, 18,662 MiB of experts, 248,320-token vocabulary
FILE, EXPERTS, VOCAB = 21_541_150_656, 19_568_525_312, 248_320
SIZES = [2_039_808 if il in (34, 38, 39) else 1_900_544 for il in range(40)]
PROD = ModelFacts(40, 256, 8, 2048, [("Q4_K", "Q4_K", "Q5_K")] * 40, SIZES, SIZES, ["deltanet"] * 40, FILE, VOCAB)
RUNTIME = RUNTIME_MIB + RUNTIME_PER_TOKEN * VOCAB / MiB
assert PROD.total_expert_bytes() == EXPERTS


def _concurrency(pool: MemoryPool, needs: list[float], hold_s: float = 0.05) -> list[tuple[float, float]]:
    """Run one thread per need through the pool; return each run's (start, end)."""
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * len(needs)

    def one(i, need):
        with pool.hold(need):
            t0 = time.perf_counter()
            assert pool.used <= (pool.capacity or float("inf")) + 1e-9
            time.sleep(hold_s)
            spans[i] = (t0, time.perf_counter())
    threads = [threading.Thread(target=one, args=(i, n)) for i, n in enumerate(needs)]
    for t in threads:
        t.start()
        time.sleep(0.005)   # arrival order = list order
    for t in threads:
        t.join()
    return spans


def _overlaps(spans) -> int:
    return max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)


def test_two_production_runs_do_not_run_together_in_8_gib():
    paged = RunSpec("p", arena_mb=4664, ram_budget_mb=8192, ctx=512)
    need = run_need_mib(paged, PROD)
    assert 6500 < need <= 8192
    pool = MemoryPool(0.9 * 8192)
    spans = _concurrency(pool, [need, need, need])
    assert _overlaps(spans) == 1 and pool.peak_runs == 1 and pool.used == 0


def test_small_runs_share_the_pool_and_a_large_one_is_not_starved():
    pool = MemoryPool(1000)
    spans = _concurrency(pool, [300, 300, 300, 900, 300, 300], hold_s=0.08)
    assert pool.peak_runs == 3                      # three small ones fit together
    big = spans[3]
    # first come, first served: the runs that came after the large one start after it ends
    assert all(s >= big[1] - 1e-3 for s, _ in spans[4:])
    assert sum(1 for s, e in spans if s < big[1] and e > big[0]) == 1   # it ran alone


def test_a_run_larger_than_the_pool_runs_alone_and_no_limit_means_no_waiting():
    pool = MemoryPool(100)
    spans = _concurrency(pool, [50, 500, 50])
    assert _overlaps(spans) == 1
    free = MemoryPool(None)
    assert _overlaps(_concurrency(free, [1e9, 1e9, 1e9], hold_s=0.1)) == 3


def test_run_need_counts_arena_resident_weights_logits_and_a_budget():
    base = dict(prompt="p", ctx=512)
    lean = run_need_mib(RunSpec(**base, arena_mb=1000, dump_logits=False), PROD)
    assert lean == pytest.approx((FILE - EXPERTS) / MiB + 1000 + RUNTIME)
    dumped = run_need_mib(RunSpec(**base, arena_mb=1000), PROD)
    assert dumped - lean == pytest.approx(2 * 512 * VOCAB * 4 / MiB)
    default = run_need_mib(RunSpec(**base, dump_logits=False), PROD)
    assert default == pytest.approx((FILE - 0.75 * EXPERTS) / MiB + RUNTIME)
    resident = run_need_mib(RunSpec(**base, pager=False, dump_logits=False), PROD)
    assert resident == pytest.approx(FILE / MiB + RUNTIME)   # the mapped file comes through memory
    assert run_need_mib(RunSpec(**base, ram_budget_mb=2048), PROD) == 2048


def test_an_arena_fraction_gives_way_to_the_memory_it_must_fit():
    """The perf runs' 25 % arena of the production model plus everything else is more than
    --ram-budget-mb 8192 (the engine refused: "needs 8272.0 MiB"); sized to the room the
    budget leaves, the whole run's estimate fits."""
    spec = EXPERIMENTS["baseline"].spec("p", {**FIXED, "ram_budget_mb": 8192.0}, PROD)
    assert spec.arena_mb < 0.25 * EXPERTS / MiB
    assert run_need_mib(RunSpec("p", ctx=spec.ctx, arena_mb=spec.arena_mb), PROD) <= 8192
    assert arena_room_mib(None, spec, PROD) is None
    free = EXPERIMENTS["baseline"].spec("p", {**FIXED, "ram_budget_mb": None}, PROD)   # no budget: the fraction
    assert free.arena_mb == pytest.approx(0.25 * EXPERTS / MiB, abs=0.01)
