"""The engine's routing against the reference's, per layer (epmci.compare.routing): the
engine's MoE dump read, the reference routing the reference's own MoE input at each position."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..compare.routing import RoutingAgreement, routing_agreement
from ..contract.outputs import read_routing
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
