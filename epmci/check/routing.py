"""Routing agreement per layer: where an engine's drift from the reference starts.

For every layer, the share of positions whose routed expert set (the top-k, order ignored)
in the engine's MoE dump equals the reference's routing of the reference's own MoE input
at that position. A logits difference explains itself by layer: the first layer below 100 %
is where the engine started choosing other experts -- also when the generated text, or a
KL within the tolerance, does not show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..contract.outputs import read_moe_dump
from ..gguf.file import ModelFile
from ..reference.moe import route, router_logits
from ..reference.ops import softmax


@dataclass(frozen=True)
class RoutingAgreement:
    per_layer: list[float]      # share of positions (0..1) whose expert set equals the reference's
    positions: int

    @property
    def first_divergent(self) -> int | None:
        return next((il for il, a in enumerate(self.per_layer) if a < 1.0), None)

    def props(self) -> dict:
        return {"routing_agreement": [round(a, 6) for a in self.per_layer], "routing_positions": self.positions,
                "routing_first_divergent_layer": self.first_divergent}

    def text(self) -> str:
        il = self.first_divergent
        if il is None:
            return f"routing = the reference's on every layer ({self.positions} positions)"
        worst = int(np.argmin(self.per_layer))
        return (f"routing first diverges at layer {il} ({100 * self.per_layer[il]:.1f} % of {self.positions} "
                f"positions agree; least at layer {worst}, {100 * self.per_layer[worst]:.1f} %)")


def routing_agreement(mf: ModelFile, dump_prefix: Path, ref_moe_in: np.ndarray, positions: int) -> RoutingAgreement:
    """The engine's MoE dump (`dump_prefix`.L) against the reference's routing of its MoE
    inputs `ref_moe_in` (n_layer, positions, n_embd), over the first `positions` rows both
    have. ContractError when a dump is missing or malformed."""
    hp = mf.hp
    per_layer = []
    n = positions
    dumps = []
    for il in range(hp.n_layer):
        sel = read_moe_dump(Path(f"{dump_prefix}.{il}"), layer=il, n_embd=hp.n_embd, k=hp.n_expert_used).concat().selected
        dumps.append(sel)
        n = min(n, len(sel))
    for il, sel in enumerate(dumps):
        ref_sel, _ = route(softmax(router_logits(mf, il, ref_moe_in[il, :n])), hp.n_expert_used)
        same = (np.sort(sel[:n], axis=1) == np.sort(ref_sel, axis=1)).all(axis=1)
        per_layer.append(float(same.mean()) if n else 0.0)
    return RoutingAgreement(per_layer, n)
