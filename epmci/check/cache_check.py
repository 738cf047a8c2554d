"""A paged run's exact counters against the contract's cache policy, on any model and with or
without golden: contract/cache_model.py replays the run's own routing (its MoE dump) and,
with prefetch, its own predictions (SDQ_PREFETCH_DUMP) under the run's settings, and every
exact counter of every phase must be what it gives. The predictions are first checked
against the reference: each must be the top-k of the router of the layer it claims, on the
hidden state it was made from -- a prediction from another layer's router fails naming both --
and that hidden state must be its layer's input (a prediction from a stale or another point's
state fails naming the layer and micro-batch).

An engine without `prefetch_dump` gets, on a prefetching run, what holds for any policy:
evictions at least Belady's floor on its routing (contract/cache_model.fewest_loads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..contract.cache_model import COUNTERS, CacheModel, Key, Prefetch, fewest_loads
from ..contract.outputs import Prediction, prompt_tokens, read_logits, read_moe_dump
from ..contract.runspec import LOGITS_FILE
from ..gguf.facts import ModelFacts
from ..reference import reference_model
from ..reference.moe import router_logits
from ..reference.tokenizer import ReferenceTokenizer
from .context import CheckContext
from .routing import dumped_lookups, dumped_predictions, lookup_count_problems

PREFETCH_DUMP = "prefetch.dump"      # the file a run's SDQ_PREFETCH_DUMP names, in its out dir
# How far a dumped hidden state may be from its layer's input, relative to the row's largest
# value: x - (out + shared) does not undo the engine's float32 sum exactly; a state from
# another token or another point of the layer is off by the order of the values themselves.
STATE_TOLERANCE = 1e-3
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
                     facts: ModelFacts | None = None, text: str | None = None) -> list[str]:
    """Problems of a run's counters (and predictions) under `setup`; `props` gets the
    oracle used and the floor. `text`: the greedy run's -p text (no chat template), whose
    tokens' embeddings layer 0's predictions must be made from. ContractError when a dump is
    missing or malformed."""
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
        bad = prediction_problem(ctx, preds) or hidden_state_problem(
            ctx, facts, preds, lookups, setup.prefetch.layer_ahead, out, text and run_tokens(ctx, text, out, stats))
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


def run_tokens(ctx: CheckContext, text: str, out: Path, stats: list[dict]) -> list[int] | None:
    """The tokens a greedy run evaluated: its prompt as the contract tokenizes -p, then each
    step's top-1 (ties: the lower id). None when the engine's prompt is another length (the
    contract suite names that defect)."""
    ids = ctx.shared("reference-tokenizer", lambda: ReferenceTokenizer.of(ctx.mf)).encode(text, parse_special=True)
    if len(ids) != prompt_tokens(stats):
        return None
    logits = read_logits(out / LOGITS_FILE)
    return ids + [int(t) for t in np.argmax(logits[len(ids) - 1:-1], axis=-1)]


def hidden_state_problem(ctx: CheckContext, facts: ModelFacts, preds: list[Prediction], lookups, layer_ahead: int,
                         out: Path, tokens: list[int] | None) -> str | None:
    """The first prediction not made from its layer's input (the contract: the residual stream
    before the layer's attention). Layer 0's is the embedding of the micro-batch's tokens (when
    they are known); layer L's is layer L-1's residual plus its MoE block, so x - (out + shared)
    of L-1's MoE dump must norm, with L-1's MoE norm, to the MoE input the run dumped for L-1."""
    ref = ctx.shared("reference-model", lambda: reference_model(ctx.mf))
    starts = [lk for lk in lookups if lk.layer + layer_ahead < facts.n_layer]
    first_row, at = {}, 0
    for lk in lookups:
        if lk.layer == 0:
            first_row[lk.batch], at = at, at + lk.rows
    if tokens is not None and len(tokens) < at:
        return (f"the logits have {len(tokens)} rows, but the run evaluated {at} positions: the tokens layer 0's "
                f"predictions were made from are unknown")
    dumps: dict[int, list] = {}
    for i, (p, lk) in enumerate(zip(preds, starts)):
        if lk.layer == 0:
            if tokens is None:
                continue
            got, want = p.x, ref.embed(np.asarray(tokens[first_row[lk.batch]:first_row[lk.batch] + lk.rows]))
            what = "the embedding of its tokens"
        else:
            if lk.layer - 1 not in dumps:
                dumps[lk.layer - 1] = read_moe_dump(out / f"moe.{lk.layer - 1}", lk.layer - 1, facts.n_embd,
                                                    facts.n_expert_used).records
            rec = dumps[lk.layer - 1][lk.batch]
            block = rec.out + rec.shared if rec.shared is not None else rec.out
            got, want = ref.moe_input(lk.layer - 1, p.x - block), rec.h
            what = (f"layer {lk.layer - 1}'s residual and MoE output (its MoE norm of x - MoE output is not its "
                    f"dumped MoE input)")
        err = np.abs(got - want).max(axis=1) / np.maximum(np.abs(want).max(axis=1), np.float32(1e-30))
        rows = np.nonzero(~(err <= STATE_TOLERANCE))[0]
        if len(rows):
            r = int(rows[0])
            return (f"prediction {i} (made at layer {p.layer} for layer {p.target}, micro-batch {lk.batch}) was "
                    f"not made from layer {p.layer}'s input: its hidden state is not {what}; {len(rows)} of "
                    f"{len(err)} rows differ, row {r} by {float(err[r]):.3g} of its largest value "
                    f"(tolerance {STATE_TOLERANCE:g})")
    return None
