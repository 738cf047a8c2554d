"""The gate on valid models none of the presets is (epmci/synth/shapes.py; no golden
baseline for any): the correct engine passes `check --fast` on each, what the model's shape
makes unreachable is a SKIP with its reason (check/plan.py), and a fault on a branch the
small model can reach is still caught there. bench/shapes.py runs the same property over
dozens of shapes (docs/shapes.md)."""

from __future__ import annotations

import re

import pytest

from epmci.check.plan import CheckPlan, late_issue_reason, pin_batch, reachable_distance, stale_reason
from epmci.config.schema import CheckConfig
from epmci.gguf.facts import ModelFacts
from epmci.synth.shapes import shape
from epmci.synth.store import shape_model
from faults import FAULT_SET, REMAINDER_LOST, broken_engine, results, run_check, statuses
from test_switches import FAULTS

# seed: what the shape is the test for
SHAPES = {
    3: "qwen3moe, 1 layer, 16 experts top-5: no layer ahead to predict",
    15: "qwen3moe, 2 layers, all 4 experts used by every token: no prediction can be wrong",
    19: "qwen35moe, 3 layers, all 8 experts used, MQA, two expert sizes",
    31: "qwen3moe, 3 layers, 64 experts top-1, MQA",
    11: "qwen3moe, 6 layers, 24 experts top-7, two expert sizes, twice as many large-slot layers",
}


def facts(**kw) -> ModelFacts:
    d = dict(n_layer=4, n_expert=8, n_expert_used=2, n_embd=256, types=[], expert_bytes=[], slot_bytes=[1] * 4)
    d.update(kw)
    return ModelFacts(**d)


def test_the_shapes_are_what_the_tests_say():
    s = {seed: shape(seed) for seed in SHAPES}
    assert (s[3].n_layer, s[3].n_expert, s[3].n_expert_used) == (1, 16, 5)
    assert (s[15].n_layer, s[15].n_expert, s[15].n_expert_used) == (2, 4, 4)
    assert s[19].arch == "qwen35moe" and (s[19].n_layer, s[19].n_expert_used) == (3, 8) and s[19].n_head_kv == 1
    assert (s[31].n_layer, s[31].n_expert, s[31].n_expert_used, s[31].n_head_kv) == (3, 64, 1, 1)
    assert (s[11].n_layer, s[11].n_expert, s[11].n_expert_used, len(s[11].q6k_down_layers)) == (6, 24, 7, 4)


def test_every_generated_shape_is_valid_and_within_size():
    for seed in range(200):
        p = shape(seed)
        assert 1 <= p.n_layer <= 16 and 4 <= p.n_expert <= 128 and 1 <= p.n_expert_used <= min(8, p.n_expert)
        assert p.n_embd % 256 == 0 and p.n_ff_exp % 256 == 0 and p.n_head * p.head_dim % 256 == 0
        assert p.n_head % p.n_head_kv == 0


def test_the_reachability_rule_on_model_facts():
    """The line between a branch a run must reach and one the model cannot (plan.py)."""
    assert [reachable_distance(n, 2) for n in (1, 2, 3, 8)] == [0, 1, 2, 2]
    assert late_issue_reason(3, 1) is None and late_issue_reason(4, 2) is None
    assert "needs 3 layers" in late_issue_reason(2, 1) and "needs 4 layers" in late_issue_reason(3, 2)
    assert "dropped at its own layer's lookup" in late_issue_reason(8, 0)
    assert stale_reason(facts(), 0) is None
    assert "no prediction can be wrong" in stale_reason(facts(n_expert_used=8), 0)
    assert "1-layer" in stale_reason(facts(n_layer=1, slot_bytes=[1]), 0)
    # a hot pin needs a slot the micro-batch leaves: 1 layer of 8 experts, top-2 -> -b 3 at most
    assert pin_batch(facts(n_layer=1, slot_bytes=[1]), 4) == 3 and pin_batch(facts(), 4) == 4
    assert pin_batch(facts(n_layer=1, n_expert=4, n_expert_used=4, slot_bytes=[1]), 4) is None


def test_the_plan_says_what_it_changed_and_why():
    plan = CheckPlan.of(CheckConfig(), facts(n_layer=1, slot_bytes=[1]), jobs=2, memory_mb=1000.0)
    assert plan.stress_layer_ahead == 0 and plan.far_layer_ahead == 0 and plan.hot_pin_batch == 3
    text = plan.text()
    assert "prefetch-stress layer-ahead 1 -> 0" in text and "hot-pin run -b 4 -> 3" in text
    assert "no queue run (no layer ahead to predict)" in text
    assert plan.to_dict()["adjusted"] == list(plan.adjusted)
    ci = CheckPlan.of(CheckConfig(), facts(n_layer=8, n_expert=64, n_expert_used=4, slot_bytes=[1] * 8), 2, None)
    assert (ci.stress_layer_ahead, ci.far_layer_ahead, ci.small_queue, ci.hot_pin_batch, ci.adjusted) == (1, 2, 2, 4, ())
    top1 = CheckPlan.of(CheckConfig(), facts(n_expert_used=1, n_expert=2), 2, None)
    assert top1.small_queue == 1       # a micro-batch predicts at most 2 experts: the queue must be smaller


def test_every_distance_the_model_predicts_at_is_run():
    """A 3-layer model's queue run stays 1 ahead (so a prediction can be issued late): the
    plan adds a run 2 ahead, the farthest it predicts. Elsewhere another run reaches it."""
    three = CheckPlan.of(CheckConfig(), facts(n_layer=3, slot_bytes=[1] * 3), 2, None)
    assert (three.far_layer_ahead, three.farthest_layer_ahead, three.farthest_run) == (1, 2, True)
    assert "a run at layer-ahead 2" in three.text()
    for n in (1, 2, 4, 8):
        plan = CheckPlan.of(CheckConfig(), facts(n_layer=n, slot_bytes=[1] * n), 2, None)
        assert not plan.farthest_run and "a run at layer-ahead" not in plan.text(), n


def test_a_margin_in_every_slot_class_where_the_split_gives_it_all_to_one():
    """Shape 11's slot classes: 48 small-slot experts, 96 large. An arena margin_experts
    slots' bytes above the minimum goes wholly to the large class (the contract's split), so
    the small class sits at its need; margin_arena_bytes finds the smallest arena that leaves
    each class the margin, and the plan adds a run at it. A uniform model needs none."""
    S, L = 487424, 520192
    f = facts(n_layer=6, n_expert=24, n_expert_used=7, slot_bytes=[L, S, L, L, S, L])
    assert f.slot_counts(f.min_arena_bytes(4, False, 3), 4, False) == {"small": 24, "large": 29}
    a = f.margin_arena_bytes(4, False, 3)
    assert f.slot_counts(a, 4, False)["small"] == 27 and f.slot_counts(a - 1, 4, False)["small"] < 27
    assert CheckPlan.of(CheckConfig(), f, 2, None).class_margin_run
    assert "a run with a margin in every slot class" in CheckPlan.of(CheckConfig(), f, 2, None).text()
    uniform = facts(n_layer=6, n_expert=24, n_expert_used=7, slot_bytes=[L] * 6)
    assert uniform.margin_arena_bytes(4, False, 3) == uniform.min_arena_bytes(4, False, 3)
    assert not CheckPlan.of(CheckConfig(), uniform, 2, None).class_margin_run


def test_a_model_too_shallow_to_consume_a_prefetch_frees_the_queue_by_eviction():
    """On 2 layers no lookup comes between a prediction and its layer's start, so only an
    eviction frees the queue: a second queue run with uniform slots in the minimum arena."""
    two = CheckPlan.of(CheckConfig(), facts(n_layer=2, slot_bytes=[1, 2]), 2, None)
    assert two.queue_by_eviction and "only evictions free the queue" in two.text()
    assert not CheckPlan.of(CheckConfig(), facts(n_layer=3, slot_bytes=[1] * 3), 2, None).queue_by_eviction
    assert not CheckPlan.of(CheckConfig(), facts(n_layer=1, slot_bytes=[1]), 2, None).queue_by_eviction


def test_the_queue_run_of_the_plan_takes_the_users_settings():
    """switches.queue_layer_ahead and switches.queue replace the derived ones; a distance
    the model cannot predict is brought back to one it can, and the plan says so."""
    cfg = CheckConfig()
    cfg.switches.queue_layer_ahead, cfg.switches.queue = 3, 5
    plan = CheckPlan.of(cfg, facts(n_layer=8), 2, None)
    assert (plan.far_layer_ahead, plan.small_queue, plan.adjusted) == (3, 5, ())
    assert "queue run layer-ahead 3, queue 5" in plan.text()
    cfg.switches.queue_layer_ahead = 6
    plan = CheckPlan.of(cfg, facts(n_layer=4), 2, None)
    assert plan.far_layer_ahead == 3 and "queue run layer-ahead 6 -> 3" in plan.text()


def test_the_plan_states_the_lengths_of_its_runs():
    """The model suite's prompt positions (a share of the trained context, capped by
    max_positions) and every kind of run's decode steps are part of the printed plan."""
    cfg = CheckConfig()
    cfg.model_suite.max_positions = 96
    plan = CheckPlan.of(cfg, facts(n_ctx_train=4096), 2, None)
    assert plan.model_positions == 96 and "model suite 96 prompt positions" in plan.text()
    assert CheckPlan.of(cfg, facts(n_ctx_train=64), 2, None).model_positions == 32
    assert plan.to_dict()["decode"] == {"layer, prefetch-stress, determinism": 4, "switches": 6, "e2e": 8,
                                        "model": 8, "perf": 16}
    assert "decode steps: layer, prefetch-stress, determinism 4, switches 6" in plan.text()


def test_the_plan_compares_an_uneven_thread_count_and_the_runners_cpus():
    """-t 1 against 2, 3 (an odd count splits power-of-two sizes unevenly) and the CPUs a
    production run would use; a count the user names replaces them."""
    assert CheckPlan.of(CheckConfig(), facts(), 2, None, cpus=2).other_threads == (2, 3)
    assert CheckPlan.of(CheckConfig(), facts(), 2, None, cpus=16).other_threads == (2, 3, 16)
    cfg = CheckConfig()
    cfg.engine.threads, cfg.determinism.threads_alt = 4, "auto"
    assert CheckPlan.of(cfg, facts(), 2, None, cpus=4).other_threads == (1, 2, 3)
    cfg.determinism.threads_alt = [5]
    plan = CheckPlan.of(cfg, facts(), 2, None, cpus=4)
    assert plan.other_threads == (5,) and "determinism also at -t 5" in plan.text()


@pytest.mark.long
@pytest.mark.usefixtures("built_engine")
@pytest.mark.parametrize("seed", list(SHAPES))
def test_the_correct_engine_passes_every_shape(tmp_path, seed):
    rc, rep = run_check(tmp_path, shape_model(seed), None, "--fast", "--no-build")
    bad = [(s["name"], r["name"], r["message"]) for s in rep["suites"] for r in s["results"]
           if r["status"] not in ("pass", "skip")]
    assert rc == 0 and not bad, bad
    skipped = {f"{s['name']} / {r['name']}": r["message"] for s in rep["suites"] for r in s["results"]
               if r["status"] == "skip" and r["properties"].get("skipped_by") == "model"}
    assert rep["meta"]["plan"]["jobs"] == 2
    if seed == 3:
        assert skipped == {"switches / default: prefetch": "a 1-layer model has no layer 1 ahead to predict",
                           "switches / far layer-ahead, small queue": "a 1-layer model has no layer ahead to predict",
                           "switches / layer-ahead 0, stale 0: SDQ_PREFETCH_STALE_TOKENS":
                               stale_reason(facts(n_layer=1, slot_bytes=[1]), 0),
                           "switches / an arena where the eviction order decides":
                               "all 16 experts are one micro-batch's need: nothing is ever evicted"}, skipped
    if seed == 15:
        assert "no prediction can be wrong" in skipped["switches / layer-ahead 0, stale 0: SDQ_PREFETCH_STALE_TOKENS"]
        assert "needs 3 layers" in skipped["switches / far layer-ahead, small queue: SDQ_PREFETCH_QUEUE"]
    if seed == 31:       # 3 layers reach every branch
        assert not skipped, skipped


@pytest.mark.usefixtures("built_engine")
def test_a_late_issue_fault_is_caught_on_a_3_layer_model(tmp_path):
    """The late-issued prefetch reading its neighbour: on 3 layers the plan predicts 1 layer
    ahead (2 would leave no layer start to issue late at), and the run reaches the branch."""
    fault = "a late-issued prefetch reads the neighbouring expert"
    _, says = FAULTS[fault]
    rc, rep = run_check(tmp_path, shape_model(31), broken_engine(tmp_path, FAULT_SET[fault].patch), "--suites", "switches",
                        "--set", "switches.runs=[default, 'far layer-ahead, small queue']")
    st = statuses(rep, "switches")
    assert rc == 1 and st == {"default": "pass", "far layer-ahead, small queue": "fail"}, st
    far = results(rep, "switches")[1]
    assert says in far["message"] and far["properties"]["env"]["SDQ_PREFETCH_LAYER_AHEAD"] == "1"


@pytest.mark.usefixtures("built_engine")
def test_a_two_layer_ahead_fault_is_caught_on_a_3_layer_model(tmp_path):
    """Prefetches 2 layers ahead reading the layer before's expert: the queue run predicts 1
    ahead on 3 layers, so only the farthest-distance run reaches the branch."""
    fault = "two-layer-ahead prefetch reads the layer before"
    rc, rep = run_check(tmp_path, shape_model(31), broken_engine(tmp_path, FAULT_SET[fault].patch), "--suites",
                        "switches", "--set", "switches.runs=[default, 'far layer-ahead, small queue', "
                                                                    "'farthest layer-ahead']")
    st = statuses(rep, "switches")
    assert rc == 1 and st == {"default": "pass", "far layer-ahead, small queue": "pass",
                              "farthest layer-ahead": "fail"}, st
    farthest = results(rep, "switches")[2]
    assert "logits" in farthest["message"] and farthest["properties"]["env"]["SDQ_PREFETCH_LAYER_AHEAD"] == "2"


@pytest.mark.usefixtures("built_engine")
def test_a_slot_plan_fault_past_the_small_class_need_is_caught_on_shape_11(tmp_path):
    """One small slot fewer than the plan gives, where the small class has more than its
    need: every other switch run holds the small class at its need on shape 11, so only the
    run with a margin in every class reaches it; the resource promise names the slots."""
    fault = "mixed arena: one small slot fewer than it holds"
    rc, rep = run_check(tmp_path, shape_model(11), broken_engine(tmp_path, FAULT_SET[fault].patch), "--suites",
                        "switches", "--set", "switches.runs=[default, 'a margin in every slot class']")
    st = statuses(rep, "switches")
    assert rc == 1 and st == {"default": "pass", "a margin in every slot class": "fail"}, st
    msg = results(rep, "switches")[1]["message"]
    m = re.search(r"the contract gives (\d+) small \+ (\d+) large slots, the engine reports (\d+) small \+ (\d+)", msg)
    assert m and int(m[1]) == int(m[3]) + 1 and m[2] == m[4], msg


@pytest.mark.usefixtures("built_engine")
def test_an_lru_order_fault_is_caught_where_every_token_uses_every_expert(tmp_path):
    """Shape 19 (3 layers, all 8 experts used, two slot sizes): in the default run's arena
    which of a layer's experts survive changes no count, so a cache that never refreshes a
    hit passes there; the run in the arena chosen on that run's routing counts differently."""
    fault = "LRU order not updated on a hit"
    run = "an arena where the eviction order decides"
    rc, rep = run_check(tmp_path, shape_model(19), broken_engine(tmp_path, FAULT_SET[fault].patch), "--suites",
                        "switches", "--set", f"switches.runs=[default, '{run}']")
    st = statuses(rep, "switches")
    assert rc == 1 and st == {"default": "pass", run: "fail"}, st
    order = next(r for r in results(rep, "switches") if r["name"] == run)
    assert "not what the contract's cache policy gives" in order["message"]
    assert "a hit does not make its entry recent" in order["properties"]["order_arena"]["alternatives_told"]


@pytest.mark.usefixtures("built_engine")
def test_the_order_run_fails_closed_when_the_routing_it_is_chosen_on_is_unusable(tmp_path):
    """An engine that dumps no routing unless its slots are uniform: the default run fails on
    its missing dump, and the order run, whose arena that routing chooses, fails naming it --
    no arena guessed, no run made, no pass."""
    patch = """
        import os
        import engine.dumps as D
        good = D.MoEDumpWriter.write
        D.MoEDumpWriter.write = lambda self, t: good(self, t) if os.environ.get("SDQ_FORCE_UNIFORM_SLOT") == "1" else None
    """
    run = "an arena where the eviction order decides"
    rc, rep = run_check(tmp_path, shape_model(19), broken_engine(tmp_path, patch), "--suites", "switches",
                        "--set", f"switches.runs=[default, '{run}']")
    st = statuses(rep, "switches")
    assert rc == 1 and st == {"default": "fail", run: "fail"}, st
    order = next(r for r in results(rep, "switches") if r["name"] == run)
    assert "the default run's output, whose routing chooses this run's arena, is unusable" in order["message"]


@pytest.mark.usefixtures("built_engine")
def test_a_late_issue_fault_is_caught_on_a_2_layer_model(tmp_path):
    """The late-issued prefetch reading its neighbour, on 2 layers: an eviction in the queue
    run's uniform minimum arena lets a waiting prediction out late, and its bytes are wrong."""
    fault = "a late-issued prefetch reads the neighbouring expert"
    rc, rep = run_check(tmp_path, shape_model(15), broken_engine(tmp_path, FAULT_SET[fault].patch), "--suites",
                        "switches", "--set", "switches.runs=[default, 'small queue freed by evictions']")
    st = statuses(rep, "switches")
    assert rc == 1 and st["small queue freed by evictions"] == "fail" and st["default"] == "pass", st
    queue = next(r for r in results(rep, "switches") if r["name"] == "small queue freed by evictions")
    assert queue["properties"]["env"]["SDQ_FORCE_UNIFORM_SLOT"] == "1" and "differs" in queue["message"]


@pytest.mark.usefixtures("built_engine")
def test_the_margin_run_is_a_skip_where_the_memory_cannot_hold_its_arena(tmp_path):
    """A memory (run.memory_mb) that holds shape 11's ordinary switch arenas but not the
    margin run's: that run is a SKIP naming both sizes, never a run the memory cannot hold."""
    from epmci.contract.memory import fixed_need_mib
    from epmci.contract.runspec import RunSpec
    from epmci.gguf.file import ModelFile
    from epmci.units import MiB
    cfg, model = CheckConfig(), shape_model(11)
    f = ModelFacts.of(ModelFile(model), cfg.run.slot_align, cfg.run.slot_windows)
    b, m = cfg.switches.batch, cfg.switches.margin_experts
    between = (f.min_arena_bytes(b, False, m) + f.margin_arena_bytes(b, False, m)) / 2 / MiB
    memory = fixed_need_mib(RunSpec("", batch=b, ctx=cfg.engine.ctx), f) + between / 0.95
    rc, rep = run_check(tmp_path, model, None, "--suites", "switches", "--no-build", "--set", f"run.memory_mb={memory:.1f}",
                        "--set", "switches.runs=[default, 'a margin in every slot class']")
    st = statuses(rep, "switches")
    assert rc == 0 and st == {"default": "pass", "a margin in every slot class": "skip"}, st
    skip = results(rep, "switches")[1]
    assert "more than the" in skip["message"] and skip["properties"]["skipped_by"] == "memory", skip


@pytest.mark.usefixtures("built_engine")
def test_under_reported_evictions_are_caught_on_a_2_layer_model(tmp_path):
    """An engine that reports no evictions: prefetch-stress holds them to the fewest any
    policy needs on the run's own routing (Belady), with no golden to compare with."""
    patch = FAULT_SET["evictions reported as 0"].patch
    rc, rep = run_check(tmp_path, shape_model(15), broken_engine(tmp_path, patch), "--suites", "prefetch-stress")
    heads = [r for r in results(rep, "prefetch-stress") if r["name"].endswith(" run")]
    assert rc == 1 and heads and all(r["status"] == "fail" for r in heads), heads
    assert all("0 evictions, but no policy serves this run's routing" in r["message"] for r in heads)
    assert all(r["properties"]["fewest_evictions"] > 0 for r in heads)


@pytest.mark.usefixtures("built_engine")
def test_a_prefetch_into_the_wrong_bytes_is_caught_on_a_1_layer_model(tmp_path):
    """On one layer the stress run predicts its own layer (distance 0): a prefetch that reads
    the neighbouring expert's bytes is computed from, and the MoE dump differs."""
    patch = FAULT_SET["a prefetch reads the neighbouring expert's bytes"].patch
    rc, rep = run_check(tmp_path, shape_model(3), broken_engine(tmp_path, patch), "--suites", "prefetch-stress")
    st = statuses(rep, "prefetch-stress")
    assert rc == 1 and st["mixed L0"] == "fail" and st["uniform L0"] == "fail", st


def test_a_dump_with_fewer_lookups_than_the_counters_fails_closed():
    """The eviction floor and the switches' cache model rest on the run's MoE dump: a dump
    that lost lookups (an empty one included) is a failure, never a floor of 0."""
    from epmci.check.routing import lookup_count_problems
    from epmci.contract.cache_model import Lookup
    stats = [{"phase": "prefill", "hits": 3, "misses": 5}, {"phase": "decode", "hits": 1, "misses": 1}]
    full = [Lookup("prefill", 0, [1, 2, 3, 4]), Lookup("prefill", 1, [1, 2, 3, 4]), Lookup("decode", 0, [5, 6])]
    assert lookup_count_problems(stats, full) == []
    assert len(lookup_count_problems(stats, [])) == 2
    assert "looked up 0" in lookup_count_problems(stats, full[:2])[0]


# Cache-policy faults that change no logit: on a model with no golden only the replay of the
# contract's policy on the run's own routing and predictions can see them (check/cache_check.py).
POLICY_FAULTS = {         # fault -> what one of the failures must say
    "LRU order not updated on a hit": "counters are not what the contract's cache policy gives",
    "a full prefetch queue silently drops a waiting prediction": "counters are not what the contract's cache policy gives",
    "predictions made with the current layer's router": "router's top-1 on the hidden state it was made from",
    "predictions made from the previous micro-batch's hidden state": "was not made from layer",
}


@pytest.mark.usefixtures("built_engine")
@pytest.mark.parametrize("fault", list(POLICY_FAULTS))
def test_a_cache_policy_fault_is_caught_without_golden(tmp_path, fault):
    """On a 3-layer top-1 model of 64 experts (no golden baseline), each fault fails the
    prefetch-stress runs and the prefetching switch runs by their counters or predictions."""
    says = POLICY_FAULTS[fault]
    rc, rep = run_check(tmp_path, shape_model(31), broken_engine(tmp_path, FAULT_SET[fault].patch), "--suites",
                        "prefetch-stress,switches", "--set", "switches.runs=[default, 'far layer-ahead, small queue']")
    failed = [r for s in ("prefetch-stress", "switches") for r in results(rep, s) if r["status"] == "fail"]
    assert rc == 1 and any(says in r["message"] for r in failed), [(r["name"], r["message"][:300]) for r in failed]
    assert not [r for s in rep["suites"] for r in s["results"] if r["status"] == "error"]


@pytest.mark.usefixtures("built_engine")
def test_a_fault_in_uneven_thread_splits_is_caught_where_2_threads_split_evenly(tmp_path):
    """On the 3-layer 64-expert model every work split at -t 2 is even, so -t 1 vs 2 is
    byte-identical; the plan's -t 3 splits unevenly and the lost remainder shows."""
    rc, rep = run_check(tmp_path, shape_model(31), broken_engine(tmp_path, REMAINDER_LOST), "--suites", "determinism")
    st = statuses(rep, "determinism")
    assert rc == 1 and st["threads 1 vs 2"] == "pass" and st["threads 1 vs 3"] == "fail", st
    assert "logits not byte-identical with -t 3" in results(rep, "determinism")[2]["message"]


@pytest.mark.usefixtures("built_engine")
def test_a_leak_per_token_is_caught_without_golden(tmp_path):
    """1 MiB kept per micro-batch (every decoded token): the budget suite's longer run peaks
    64 MiB higher than its KV and logits rows allow; the correct engine moves < 1 MiB."""
    leak = FAULT_SET["1 MiB kept every decoded token"].patch
    for engine_cmd, status in ((None, "pass"), (broken_engine(tmp_path, leak), "fail")):
        rc, rep = run_check(tmp_path, shape_model(31), engine_cmd, "--suites", "budget", "--no-build")
        r = results(rep, "budget")[2]
        assert r["name"] == "memory does not grow with tokens" and r["status"] == status, r["message"]
    assert "memory grows with tokens" in r["message"] and r["properties"]["extra_tokens"] == 64


@pytest.mark.usefixtures("built_engine")
def test_a_prediction_from_a_stale_state_is_caught_on_a_1_layer_model(tmp_path):
    """One layer predicts only at layer 0: the dumped state must be the embedding of the
    micro-batch's tokens (the prompt as -p tokenizes, then each step's top-1)."""
    fault = "predictions made from the previous micro-batch's hidden state"
    rc, rep = run_check(tmp_path, shape_model(3), broken_engine(tmp_path, FAULT_SET[fault].patch), "--suites",
                        "prefetch-stress")
    heads = [r for r in results(rep, "prefetch-stress") if r["name"].endswith(" run")]
    assert rc == 1 and heads and all(r["status"] == "fail" for r in heads), heads
    assert all("was not made from layer 0's input: its hidden state is not the embedding of its tokens" in r["message"]
               for r in heads)
