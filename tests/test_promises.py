"""Every paged run is held to the contract's resource promises (epmci/contract/promises.py):
the slots per class and the arena bytes it reports are what the contract computes for the
size asked, peak RSS stays under the budget, and the bytes read fit the reads counted. The
contract's slot counts (epmci) agree with the engine's own plan on every arena size; copies
of the engine that take one slot too many or too few in one slot layout fail the run that
uses that layout, naming both counts."""

from __future__ import annotations

import random

import pytest

from engine.gguf_model import GGUFModel
from engine.paging.arena import layer_layouts, plan_slots
from epmci.contract.promises import Promises, broken_promises
from epmci.gguf.facts import ModelFacts
from epmci.gguf.file import ModelFile
from epmci.synth.store import make_model
from faults import FAULT_SET, broken_engine, results, run_check, slot_fault, statuses


@pytest.mark.parametrize("preset", ["tiny", "ci", "tiny35"])
@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("uniform", [False, True])
def test_the_contracts_slot_counts_equal_the_engines(preset, direct, uniform):
    """Two implementations of one documented rule, held together on 200 arena sizes from the
    minimum to past every expert, at two micro-batches."""
    path = make_model(preset)
    gm = GGUFModel(path)
    layouts = layer_layouts(gm, direct)
    facts = ModelFacts.of(ModelFile(path), 4096, windows=direct)
    rng = random.Random(f"{preset}{direct}{uniform}")
    for batch in (1, 8):
        lo = facts.min_arena_bytes(batch, uniform)
        hi = 2 * max(facts.slot_bytes) * facts.n_expert * facts.n_layer
        for arena in [lo, lo + 1, hi] + [rng.randrange(lo, hi) for _ in range(200)]:
            plan = plan_slots(layouts, gm.hp.n_expert, gm.hp.n_expert_used, batch, arena, uniform)
            want = facts.slot_counts(arena, batch, uniform)
            assert want == {"small": plan.n_class("small"), "large": plan.n_class("large")}, (arena, batch)
        assert facts.slot_counts(lo - 1, batch, uniform) is None


def record(**kw) -> dict:
    base = {"phase": "decode", "n_slots": 10, "n_slots_small": 6, "n_slots_large": 4, "arena_mb": 0.0,
            "misses": 2, "prefetch_issued": 1, "ssd_bytes": 0, "io_bytes": 0, "peak_rss_mb": 100.0}
    return {**base, **kw}


def test_reads_and_budget_promises_on_made_up_records(tiny_model):
    facts = ModelFacts.of(ModelFile(tiny_model), 4096)
    eb, sb = min(facts.expert_bytes), max(facts.slot_bytes)     # tiny: two expert sizes
    good = record(ssd_bytes=3 * eb, io_bytes=3 * eb, n_slots=10)
    kw = dict(arena_mb=None, batch=2, ram_budget_mb=128.0, env={})
    assert broken_promises(facts, records=[good], **kw) == []
    (p,) = broken_promises(facts, records=[record(ssd_bytes=3 * eb - 1, io_bytes=3 * eb)], **kw)
    assert "ssd_bytes" in p and "3 reads" in p
    (p,) = broken_promises(facts, records=[record(ssd_bytes=3 * max(facts.expert_bytes) + 1, io_bytes=3 * sb)], **kw)
    assert "ssd_bytes" in p
    (p,) = broken_promises(facts, records=[record(ssd_bytes=3 * eb, io_bytes=3 * sb + 1)], **kw)
    assert "io_bytes" in p
    (p,) = broken_promises(facts, records=[good | {"peak_rss_mb": 129.0}], **kw)
    assert "over the budget" in p and "128" in p
    (p,) = broken_promises(facts, records=[good | {"n_slots": 11}], **kw)
    assert "n_slots 11" in p


def test_slot_promises_name_both_counts(tiny_model):
    promises = Promises.of(ModelFile(tiny_model), 4096)
    facts = promises.windows
    arena_mb = 3 * facts.min_arena_bytes(2, False) / 2**20
    want = facts.slot_counts(int(float(f"{arena_mb:.6f}") * 2**20), 2, False)
    sizes = facts.slot_classes(False)
    used = (want["small"] * sizes[0] + want["large"] * sizes[-1]) if len(sizes) == 2 else want["large"] * sizes[0]
    rec = record(n_slots=want["small"] + want["large"], n_slots_small=want["small"], n_slots_large=want["large"],
                 arena_mb=round(used / 2**20, 3), misses=0, prefetch_issued=0)
    kw = dict(arena_mb=arena_mb, batch=2, ram_budget_mb=None, env={})
    assert promises.broken(records=[rec], **kw) == []
    fewer = rec | {"n_slots_large": want["large"] - 1, "n_slots": rec["n_slots"] - 1}
    (p, *_) = promises.broken(records=[fewer], **kw)
    assert f"{want['large']} large" in p and f"{want['large'] - 1} large" in p
    # an arena below the minimum must be refused; an engine that ran with it broke a promise
    tiny_arena = facts.min_arena_bytes(2, False) / 2 / 2**20
    (p, *_) = promises.broken(records=[rec], **{**kw, "arena_mb": tiny_arena})
    assert "below the contract's minimum" in p and "must refuse" in p
    # the slots may not change between the records of one run
    changed = rec | {"phase": "decode", "n_slots_small": want["small"] - 1, "n_slots": rec["n_slots"] - 1}
    assert any("the arena changed during the run" in x for x in promises.broken(records=[rec, changed], **kw))
    # SDQ_ARENA_MB overrides --arena-mb: the same record against twice the arena is wrong
    assert promises.broken(records=[rec], **{**kw, "arena_mb": 2 * arena_mb, "env": {"SDQ_ARENA_MB": f"{arena_mb:.6f}"}}) == []
    assert promises.broken(records=[rec], **{**kw, "arena_mb": 2 * arena_mb})


# A slot plan off by one in one layout, and the switches run that uses that layout: the run
# fails with both counts (the contract's and the engine's).
SLOT_FAULTS = {
    "mixed arena: one small slot fewer than it holds": (
        FAULT_SET["mixed arena: one small slot fewer than it holds"].patch, "default"),
    "uniform arena: one slot more than it holds": (
        FAULT_SET["uniform arena: one slot more than it holds"].patch, "hot pins, uniform slots"),
    "admission: one large slot fewer": (
        slot_fault("os.environ.get('SDQ_ADMIT_MIN_HITS', '1') != '1' and p.n_slots[-1] > p.need[-1]",
                   "p.n_slots[:-1] + (p.n_slots[-1] - 1,)"), "admit=2, -b 1"),
    "pins: one slot fewer": (
        slot_fault("os.environ.get('SDQ_HOT_PIN') and p.n_slots[-1] > p.need[-1] + 8",
                   "p.n_slots[:-1] + (p.n_slots[-1] - 1,)"), "hot pins, uniform slots"),
}


@pytest.mark.usefixtures("built_engine")
@pytest.mark.parametrize("fault", list(SLOT_FAULTS))
def test_a_slot_count_fault_fails_the_run_of_its_layout(tmp_path, tiny_model, fault):
    patch, run = SLOT_FAULTS[fault]
    rc, rep = run_check(tmp_path, tiny_model, broken_engine(tmp_path, patch), "--suites", "switches",
                        "--set", f"switches.runs={list(dict.fromkeys(['default', run]))}")
    st = statuses(rep, "switches")
    assert rc == 1 and st[run] == "fail", st
    (r,) = [r for r in results(rep, "switches") if r["name"] == run]
    assert "broke a resource promise" in r["message"] and "the contract gives" in r["message"], r["message"]
