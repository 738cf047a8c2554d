"""A paged run's exact counters against the contract's cache policy, on any model and with or
without golden: contract/cache_model.py replays the run's own routing (its MoE dump) and,
with prefetch, its own predictions (SDQ_PREFETCH_DUMP) under the run's settings, and every
exact counter of every phase must be what it gives. The predictions are first checked
against the reference: each must be the top-k of the router of the layer it claims, on the
hidden state it was made from -- a prediction from another layer's router fails naming both.

An engine without `prefetch_dump` gets, on a prefetching run, what holds for any policy:
evictions at least Belady's floor on its routing (contract/cache_model.fewest_loads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..contract.cache_model import COUNTERS, CacheModel, Key, Prefetch, fewest_loads
from ..contract.outputs import Prediction, prompt_tokens
from ..gguf.facts import ModelFacts
from ..reference import reference_model
from ..reference.moe import router_logits
from .context import CheckContext
from .routing import dumped_lookups, dumped_predictions, lookup_count_problems

PREFETCH_DUMP = "prefetch.dump"      # the file a run's SDQ_PREFETCH_DUMP names, in its out dir
# The contract's defaults of the switches the policy depends on (docs/engine-contract.md, Environment)
DEFAULTS = {"SDQ_PREFETCH": "1", "SDQ_PREFETCH_LAYER_AHEAD": "1", "SDQ_PREFETCH_QUEUE": "64",
            "SDQ_PREFETCH_STALE_TOKENS": "2", "SDQ_ADMIT_MIN_HITS": "1", "SDQ_FORCE_UNIFORM_SLOT": "0"}


@dataclass(frozen=True)
class CacheSetup:
    """What the policy needs to know of a run besides its routing: its settings."""
    batch: int
    uniform: bool
    admit_min_hits: int
    prefetch: Prefetch | None
    pins: tuple[Key, ...] = field(default=())

    @classmethod
    def of(cls, ctx: CheckContext, env: dict[str, str], batch: int, prefetch: bool = True, pins=()) -> "CacheSetup":
        """From a run's SDQ_* environment -- engine.env under the run's own, as the run gets
        them; unset: the contract's defaults -- and --no-prefetch."""
        v = {**DEFAULTS, **{k: s for k, s in {**dict(ctx.engine.env), **env}.items() if s.strip()}}
        on = prefetch and v["SDQ_PREFETCH"] == "1"
        pf = Prefetch(int(v["SDQ_PREFETCH_LAYER_AHEAD"]), int(v["SDQ_PREFETCH_QUEUE"]),
                      int(v["SDQ_PREFETCH_STALE_TOKENS"])) if on else None
        return cls(batch, v["SDQ_FORCE_UNIFORM_SLOT"] == "1", int(v["SDQ_ADMIT_MIN_HITS"]), pf, tuple(pins))


def prefetch_env(ctx: CheckContext, out: Path) -> dict[str, str]:
    """The variable that makes a run dump its predictions, if the engine can."""
    return {"SDQ_PREFETCH_DUMP": str(out / PREFETCH_DUMP)} if ctx.engine.has("prefetch_dump") else {}


def counter_problems(ctx: CheckContext, out: Path, stats: list[dict], setup: CacheSetup, props: dict,
                     facts: ModelFacts | None = None) -> list[str]:
    """Problems of a run's counters (and predictions) under `setup`; `props` gets the
    oracle used and the floor. ContractError when a dump is missing or malformed."""
    facts = facts or ctx.facts
    uniform = setup.uniform or len(set(facts.slot_bytes)) == 1
    classes = facts.class_of_layers(uniform)
    n_slots = [int(stats[0].get("n_slots_small", 0)), int(stats[0].get("n_slots_large", 0))]
    prompt = prompt_tokens(stats)
    lookups, rows = dumped_lookups(facts, out / "moe", prompt)
    problems = lookup_count_problems(stats, lookups)      # every oracle below rests on the whole routing
    if len(rows) != math.ceil(prompt / setup.batch) or max(rows, default=0) > setup.batch:
        problems.append(f"-b {setup.batch}: the prompt of {prompt} tokens was evaluated in {len(rows)} micro-batches "
                        f"(largest {max(rows, default=0)} rows), expected {math.ceil(prompt / setup.batch)}")
    if setup.admit_min_hits == 1:          # every miss enters a slot (a transient read bypasses them)
        loads = fewest_loads(lookups, classes, n_slots)
        props["fewest_evictions"] = least = sum(max(0, n - s) for n, s in zip(loads, n_slots))
        evictions = sum(int(s.get("evictions", 0)) for s in stats)
        if evictions < least:
            problems.append(f"{evictions} evictions, but no policy serves this run's routing with {n_slots[0]} "
                            f"small and {n_slots[1]} large slots in fewer than {least}")
    if setup.uniform and n_slots[0] != 0:
        problems.append(f"uniform slots asked for, but the arena has {n_slots[0]} small slots")
    predicted = None
    if setup.prefetch is not None:
        if not ctx.engine.has("prefetch_dump"):
            props["counters_oracle"] = "Belady's floor only (the engine lacks prefetch_dump: its predictions are unknown)"
            return problems
        preds, predicted = dumped_predictions(out / PREFETCH_DUMP, facts, lookups, setup.prefetch.layer_ahead)
        props["predictions_checked"] = len(preds)
        bad = prediction_problem(ctx, preds)
        if bad:
            return problems + [bad]          # counters replayed on wrong predictions would say less
    props["counters_oracle"] = "the contract's cache policy on its routing" + (" and predictions" if predicted else "")
    model = CacheModel(n_slots, classes, facts.expert_bytes, min(facts.n_expert, setup.batch * facts.n_expert_used),
                       setup.admit_min_hits, list(setup.pins), setup.prefetch)
    want = model.run(lookups, predicted)
    for s in stats:
        exp = want.get(s["phase"])
        exp = exp.as_dict() if exp else dict.fromkeys(COUNTERS, 0)
        bad = [f"{k} {s.get(k)} (the policy: {exp[k]})" for k in COUNTERS if k in s and s[k] != exp[k]]
        if bad:
            problems.append(f"{s['phase']} counters are not what the contract's cache policy gives on this run's "
                            f"routing{' and predictions' if predicted else ''}: " + ", ".join(bad))
    return problems


def predicted_experts(ctx: CheckContext, target: int, x: np.ndarray) -> np.ndarray:
    """(rows, k): the reference's layer-ahead prediction -- `target`'s router on its MoE norm
    of x, top-k by logit (ties: lower id first)."""
    ref = ctx.shared("reference-model", lambda: reference_model(ctx.mf))
    logits = router_logits(ctx.mf, target, ref.moe_input(target, x))
    return np.argsort(-logits, axis=-1, kind="stable")[:, :ctx.facts.n_expert_used].astype(np.int32)


def prediction_problem(ctx: CheckContext, preds: list[Prediction]) -> str | None:
    """The first prediction that is not its target's router's choice on its hidden state,
    described (and, when another layer's router gives it, which)."""
    for i, p in enumerate(preds):
        want = predicted_experts(ctx, p.target, p.x)
        rows = np.nonzero((want != p.selected).any(axis=1))[0]
        if not len(rows):
            continue
        r = int(rows[0])
        other = [il for il in range(ctx.facts.n_layer)
                 if il != p.target and np.array_equal(predicted_experts(ctx, il, p.x), p.selected)]
        whose = f"; they are layer {other[0]}'s router's choice" if other else ""
        return (f"prediction {i} (made at layer {p.layer} for layer {p.target}) is not layer {p.target}'s router's "
                f"top-{want.shape[1]} on the hidden state it was made from: {len(rows)} of {len(want)} rows differ, "
                f"row {r}: experts {p.selected[r].tolist()}, the reference {want[r].tolist()}{whose}")
    return None
