"""The engine's routing against the reference's, per layer (epmci.compare.routing): the
engine's MoE dump read, the reference routing the reference's own MoE input at each position;
and the lookups a run made, in run order, from its MoE dump (what the cache models take)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..compare.routing import RoutingAgreement, routing_agreement
from ..contract.cache_model import Key, Lookup
from ..contract.outputs import ContractError, Prediction, read_moe_dump, read_prefetch_dump, read_routing
from ..gguf.facts import ModelFacts
from ..gguf.file import ModelFile
from ..reference.moe import route, router_logits
from ..reference.ops import softmax


def reference_routing_agreement(mf: ModelFile, dump_prefix: Path, ref_moe_in: np.ndarray,
                                positions: int) -> RoutingAgreement:
    """The engine's MoE dump (`dump_prefix`.L) against the reference's routing of its MoE
    inputs `ref_moe_in` (n_layer, positions, n_embd), over the first `positions` rows both
    have. ContractError when a dump is missing or malformed."""
    hp = mf.hp
    engine = [sel[:positions] for sel in read_routing(dump_prefix, hp.n_layer, hp.n_embd, hp.n_expert_used)]
    n = min([positions] + [len(s) for s in engine])
    ref = [route(softmax(router_logits(mf, il, ref_moe_in[il, :n])), hp.n_expert_used)[0] for il in range(hp.n_layer)]
    return routing_agreement([s[:n] for s in engine], ref)


def lookup_count_problems(stats: list[dict], lookups: list[Lookup]) -> list[str]:
    """Each phase's hits + misses must be the (layer, expert) pairs the run looked up by
    its own MoE dump: a check built on the dump's routing fails closed on a dump that
    holds fewer lookups than the run made (an empty one included), and on counters that
    lose or invent lookups."""
    by_phase = {s["phase"]: s for s in stats}
    out = []
    for ph in ("prefill", "decode"):
        n = sum(len(lk.experts) for lk in lookups if lk.phase == ph)
        s = by_phase.get(ph, {})
        if s.get("hits", 0) + s.get("misses", 0) != n:
            out.append(f"{ph}: hits + misses = {s.get('hits', 0) + s.get('misses', 0)}, but the run "
                       f"looked up {n} (layer, expert) pairs (its MoE dump)")
    return out


def dumped_lookups(facts: ModelFacts, dump_prefix: Path, prompt: int) -> tuple[list[Lookup], list[int]]:
    """Every lookup of a run in run order, from its MoE dump (micro-batch by micro-batch,
    layer by layer; the first `prompt` rows are prefill), and the rows of each prefill
    micro-batch. ContractError when a dump is missing, malformed or the layers disagree."""
    recs = [read_moe_dump(Path(f"{dump_prefix}.{il}"), layer=il, n_embd=facts.n_embd, k=facts.n_expert_used).records
            for il in range(facts.n_layer)]
    n = len(recs[0])
    if any(len(x) != n for x in recs):
        raise ContractError(Path(f"{dump_prefix}.0"), f"layers dumped different numbers of micro-batches "
                                                      f"({sorted({len(x) for x in recs})})")
    lookups, rows, done = [], [], 0
    for m in range(n):
        phase = "prefill" if done < prompt else "decode"
        n_rows = len(recs[0][m].h)
        if phase == "prefill":
            rows.append(n_rows)
        done += n_rows
        for il in range(facts.n_layer):
            experts = list(dict.fromkeys(int(e) for e in recs[il][m].selected.ravel()))
            lookups.append(Lookup(phase, il, experts, m, n_rows))
    return lookups, rows


def dumped_predictions(path: Path, facts: ModelFacts, lookups: list[Lookup], layer_ahead: int
                       ) -> tuple[list[Prediction], dict[tuple[int, int], list[Key]]]:
    """The run's predictions (SDQ_PREFETCH_DUMP), and each one's place: (micro-batch, layer)
    -> the keys predicted at that layer's start. The contract makes one at every layer start
    whose layer + `layer_ahead` is a layer, for the micro-batch's rows; a dump with others,
    or in another order, is a ContractError naming the first that does not fit."""
    preds = read_prefetch_dump(path, facts.n_layer, facts.n_embd, facts.n_expert_used)
    starts = [lk for lk in lookups if lk.layer + layer_ahead < facts.n_layer]
    placed = {}
    for i, lk in enumerate(starts):
        if i >= len(preds):
            raise ContractError(path, f"{len(preds)} predictions, but the run started {len(starts)} layers "
                                      f"that predict (layer + {layer_ahead} < {facts.n_layer} layers)")
        p = preds[i]
        if (p.layer, p.target, len(p.x)) != (lk.layer, lk.layer + layer_ahead, lk.rows):
            raise ContractError(path, f"prediction {i}: made at layer {p.layer} for layer {p.target} on {len(p.x)} "
                                      f"rows; in run order it is the start of layer {lk.layer} of micro-batch "
                                      f"{lk.batch} ({lk.rows} rows), predicting layer {lk.layer + layer_ahead}")
        placed[(lk.batch, lk.layer)] = p.keys()
    if len(preds) > len(starts):
        raise ContractError(path, f"{len(preds)} predictions, but the run started only {len(starts)} layers "
                                  f"that predict")
    return preds, placed
