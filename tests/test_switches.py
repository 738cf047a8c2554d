"""The switches suite: every data-path switch the contract documents is exercised, the
contract's cache policy model agrees with the engine, and broken copies of the engine whose
fault lives on one configuration branch fail there, pointing at it."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest

from epmci.check.routing import dumped_predictions
from epmci.check.suites.switches import CHECKED_IN_SIMULATION, EVIDENCE, FARTHEST, NO_EVENT, RUNS
from epmci.contract.cache_model import CacheModel, Lookup, Prefetch
from epmci.contract.outputs import ContractError
from epmci.gguf.facts import ModelFacts
from faults import FAULT_SET, broken_engine, results, run_check, statuses

REPO = Path(__file__).resolve().parent.parent
ALWAYS_SET = {"SDQ_MOE_DUMP", "SDQ_PREFETCH_DUMP"}   # every switches run dumps its MoE and predictions
INSTRUMENTS = {"SDQ_STATE_DUMP"}     # the model suite's (delta-net states): a dump, no data path


def documented_switches() -> set[str]:
    text = (REPO / "docs" / "engine-contract.md").read_text(encoding="utf-8")
    env = text.split("## Environment", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(SDQ_[A-Z_]+)` \|", env, re.M))


def test_every_documented_switch_is_exercised():
    documented = documented_switches()
    assert len(documented) >= 14, documented            # the table was found and parsed
    exercised = ALWAYS_SET | INSTRUMENTS | {k for r in RUNS for k in r.env}
    assert documented - exercised == set(), "documented switches no switches run sets"
    assert any(not r.prefetch for r in RUNS) and {1, 3} <= {r.batch for r in RUNS}   # --no-prefetch, -b 1, odd -b


def test_evidence_is_asked_only_of_a_value_that_selects_the_branch():
    """SDQ_IO_PARALLEL=1 or SDQ_ADMIT_MIN_HITS=1 is the default path: no serial read or
    transient read is owed; =0 and =2 owe them."""
    assert not EVIDENCE["SDQ_IO_PARALLEL"].selects("1") and EVIDENCE["SDQ_IO_PARALLEL"].selects("0")
    assert not EVIDENCE["SDQ_ADMIT_MIN_HITS"].selects("1") and EVIDENCE["SDQ_ADMIT_MIN_HITS"].selects("2")
    assert not EVIDENCE["SDQ_PREFETCH"].selects("1") and EVIDENCE["SDQ_PREFETCH"].holds("0", {})
    assert not EVIDENCE["SDQ_PREFETCH_LAYER_AHEAD"].holds("2", {"prefetch_predictions": 5,
                                                                 "prefetch_layers_ahead": 5})


def test_every_documented_switch_has_its_branch_evidence():
    """A switch run must show that its switch's code ran: every data-path switch of the
    contract has a branch event (or a reported number the simulation checks), and the event
    is a stats field the contract documents."""
    data_path = documented_switches() - ALWAYS_SET - INSTRUMENTS
    assert data_path - set(EVIDENCE) - set(CHECKED_IN_SIMULATION) - set(NO_EVENT) == set()
    stats = (REPO / "docs" / "engine-contract.md").read_text(encoding="utf-8").split("## Stats", 1)[1]
    for switch, ev in EVIDENCE.items():
        assert re.search(rf"^\| [^|]*\b{ev.event}\b[^|]*\| branch event", stats, re.M), (switch, ev.event)


def _some(c, keys=("hits", "misses", "evictions", "ssd_bytes")) -> dict:
    return {k: v for k, v in c.as_dict().items() if k in keys}


def test_the_cache_model_on_a_hand_made_trace():
    """One class of 3 slots, need 2: LRU, admission on the 2nd lookup, a pin that is a hit
    from its first lookup."""
    m = CacheModel([0, 3], [1], [100], need=2, admit_min_hits=1)
    trace = [Lookup("prefill", 0, [1, 2]), Lookup("prefill", 0, [3, 1]), Lookup("decode", 0, [4]),
             Lookup("decode", 0, [2])]
    got = m.run(trace)
    assert _some(got["prefill"]) == {"hits": 1, "misses": 3, "evictions": 0, "ssd_bytes": 300}
    # [4] evicts the LRU entry (2), so [2] misses and evicts 3
    assert _some(got["decode"]) == {"hits": 0, "misses": 2, "evictions": 2, "ssd_bytes": 200}
    admit = CacheModel([0, 3], [1], [100], need=2, admit_min_hits=2).run(trace)
    assert _some(admit["prefill"]) == {"hits": 0, "misses": 4, "evictions": 0, "ssd_bytes": 400}
    assert admit["prefill"].transient_reads == 3        # expert 1 is admitted at its 2nd lookup
    pinned = CacheModel([0, 3], [1], [100], need=2, pins=[(0, 4), (0, 2)]).run(trace)   # one fits
    assert pinned["decode"].hits == 1 and pinned["decode"].misses == 1 and pinned["decode"].pinned_hits == 1


def test_the_cache_model_with_prefetch_on_a_hand_made_trace():
    """Two layers, 4 slots, layer-ahead 1, a queue of 1, stale after 0 tokens: the second
    prediction waits and is dropped at its layer's lookup; a prefetch evicts only an entry
    of another layer; an unconsumed prefetch goes stale at the micro-batch's end."""
    m = CacheModel([0, 4], [1, 1], [100, 100], need=2, prefetch=Prefetch(1, 1, 0))
    trace = [Lookup("prefill", 0, [1, 2], 0), Lookup("prefill", 1, [5, 7], 0),
             Lookup("decode", 0, [1], 1), Lookup("decode", 1, [6], 1),
             Lookup("decode", 0, [1], 2), Lookup("decode", 1, [7], 2)]
    predicted = {(0, 0): [(1, 5), (1, 6)], (1, 0): [(1, 6)], (2, 0): [(1, 8)]}
    got = m.run(trace, predicted)
    assert got["prefill"].as_dict() == {
        "hits": 1, "misses": 3, "evictions": 0, "ssd_bytes": 400, "prefetch_issued": 1, "prefetch_used": 1,
        "transient_reads": 0, "pinned_hits": 0, "prefetch_predictions": 1, "prefetch_layers_ahead": 1,
        "prefetch_queued": 1, "prefetch_late": 0, "prefetch_dropped": 1, "prefetch_stale": 0}
    assert got["decode"].as_dict() == {
        "hits": 3, "misses": 1, "evictions": 3, "ssd_bytes": 300, "prefetch_issued": 2, "prefetch_used": 1,
        "transient_reads": 0, "pinned_hits": 0, "prefetch_predictions": 2, "prefetch_layers_ahead": 2,
        "prefetch_queued": 0, "prefetch_late": 0, "prefetch_dropped": 0, "prefetch_stale": 1}


@pytest.mark.usefixtures("built_engine")
def test_the_bundled_engine_passes_every_switch(tmp_path, tiny_model):
    rc, rep = run_check(tmp_path, tiny_model, None, "--suites", "switches", "--no-build")
    assert rc == 0, [r["message"] for r in results(rep, "switches") if r["status"] != "pass"]
    # (tiny's other runs reach the farthest distance and leave each slot class a margin: the
    # runs planned only where they do not are not planned)
    assert set(statuses(rep, "switches")) == {r.name for r in RUNS if FARTHEST not in r.env.values()
                                              and not r.margin_in_every_class and not r.minimum_arena}
    # every run's counters are replayed: without prefetch on the routing, with it on the
    # predictions too, each checked against the reference's router
    oracle = {r["name"]: r["properties"]["counters_oracle"] for r in results(rep, "switches")}
    assert all(o.startswith("the contract's cache policy on its routing") for o in oracle.values()), oracle
    assert oracle["default"].endswith("and predictions") and oracle["admit=2, -b 1"].endswith("routing")
    assert all(r["properties"].get("predictions_checked", 1) > 0 for r in results(rep, "switches"))
    events = {r["name"]: r["properties"]["branch_events"] for r in results(rep, "switches")}
    assert events["admit=2, -b 1"]["transient_reads"] > 0 and events["default"]["transient_reads"] == 0
    assert events["far layer-ahead, small queue"]["prefetch_late"] > 0 and events["default"]["prefetch_late"] == 0
    assert events["serial reads, one reader, fadvise"]["serial_reads"] > 0
    order = next(r for r in results(rep, "switches") if r["name"] == "an arena where the eviction order decides")
    assert order["properties"]["order_arena"]["alternatives_told"], order["properties"]
    assert order["properties"]["decode"]["n_slots"] == order["properties"]["order_arena"]["slots"]


# fault (tests/faults.py) -> (the runs that take the faulty branch, what one of their failures
# must say): a fault on a branch only its runs take fails them and nothing else.
FAULTS = {
    "transient buffer of a deferred admission reads the neighbouring expert": (["admit=2, -b 1"],
                                                                               "MoE output differs from the reference"),
    "admission one lookup early": (["admit=2, -b 1"], "not what the contract's cache policy gives"),
    "hot pins loaded with the neighbouring expert's bytes": (["hot pins, uniform slots"], "differs from the reference"),
    "serial reads put the up part's bytes into down": (["serial reads, one reader, fadvise"], "differs from the reference"),
    # reads move fewer bytes than the experts
    "exact reads miss each part's last 32 bytes": (["admit=3, -b 3, exact reads, SDQ_ARENA_MB"], "io_bytes"),
    "two-layer-ahead prefetch reads the layer before": (["far layer-ahead, small queue"], ""),
    "a late-issued prefetch reads the neighbouring expert": (["far layer-ahead, small queue"],
                                                             "differs from the reference"),
    "SDQ_IO_PARALLEL=0 and SDQ_FADV_DONTNEED=1 ignored": (["serial reads, one reader, fadvise"],
                                                           "did not reach its switch's branch (SDQ_IO_PARALLEL=0"),
    "SDQ_PREFETCH_QUEUE ignored": (["far layer-ahead, small queue"],
                                   "did not reach its switch's branch (SDQ_PREFETCH_QUEUE=2"),
    "-b ignored": (["default", "admit=2, -b 1", "admit=3, -b 3, exact reads, SDQ_ARENA_MB"], "micro-batches"),
}


@pytest.mark.usefixtures("built_engine")
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_on_one_branch_fails_that_run(tmp_path, tiny_model, fault):
    failing, says = FAULTS[fault]
    runs = list(dict.fromkeys(["default", *failing]))
    rc, rep = run_check(tmp_path, tiny_model, broken_engine(tmp_path, FAULT_SET[fault].patch), "--suites", "switches",
                        "--set", f"switches.runs={runs}")
    st = statuses(rep, "switches")
    assert rc == 1 and st == {r: "fail" if r in failing else "pass" for r in runs}, st
    assert any(says in r["message"] for r in results(rep, "switches") if r["name"] in failing)


def _prediction_record(layer: int, target: int, rows: int, n_embd: int, sel: list[list[int]]) -> bytes:
    x = np.arange(rows * n_embd, dtype="<f4").tobytes()
    return b"EPMP" + struct.pack("<6I", 1, layer, target, rows, n_embd, len(sel[0])) + x + \
        np.asarray(sel, dtype="<i4").tobytes()


def test_a_prefetch_dump_that_does_not_fit_the_run_fails_closed(tmp_path):
    """The replay rests on the run's predictions: a truncated dump, one missing a prediction
    or with one at the wrong layer start is a ContractError naming it, never a replay of
    fewer predictions."""
    f = ModelFacts(n_layer=2, n_expert=8, n_expert_used=1, n_embd=4, types=[], expert_bytes=[1, 1], slot_bytes=[1, 1])
    lookups = [Lookup("prefill", 0, [1], 0, 2), Lookup("prefill", 1, [2], 0, 2), Lookup("decode", 0, [3], 1, 1),
               Lookup("decode", 1, [4], 1, 1)]
    first, second = _prediction_record(0, 1, 2, 4, [[2], [5]]), _prediction_record(0, 1, 1, 4, [[4]])
    good = first + second
    p = tmp_path / "prefetch.dump"
    p.write_bytes(good)
    preds, placed = dumped_predictions(p, f, lookups, 1)
    assert placed == {(0, 0): [(1, 2), (1, 5)], (1, 0): [(1, 4)]} and preds[0].x.shape == (2, 4)
    for data, says in ((good[:-3], "truncated"), (first + second[:9], "truncated record header"),
                       (first, "1 predictions, but the run started 2"),
                       (good + _prediction_record(1, 2, 1, 4, [[1]]), "target 2"),
                       (_prediction_record(1, 1, 2, 4, [[2], [5]]) + second, "made at layer 1")):
        p.write_bytes(data)
        with pytest.raises(ContractError, match=says):
            dumped_predictions(p, f, lookups, 1)
    p.write_bytes(b"")                               # no prefetch: none made, and none owed
    assert dumped_predictions(p, f, lookups, 2) == ([], {})
