"""Routing agreement per layer: where two runs of a model start choosing other experts.

For every layer, the share of positions whose routed expert set (the top-k, order ignored)
is the same in both. A logits difference explains itself by layer: the first layer below
100 % is where the routing left the other side's -- also when the generated text, or a KL
within a tolerance, does not show it. One rule for every comparison that reports it: an
engine against the reference (model suite) and a run against its golden baseline (perf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class RoutingAgreement:
    per_layer: list[float]      # share of positions (0..1) whose expert set is the same on both sides
    positions: int              # positions compared: the rows both sides have
    rows: tuple[int, int] = (0, 0)   # rows each side had (a run that evaluated other rows differs)
    other: str = "the reference"     # what the routing was compared with, for the text

    @property
    def first_divergent(self) -> int | None:
        return next((il for il, a in enumerate(self.per_layer) if a < 1.0), None)

    @property
    def same(self) -> bool:
        return self.first_divergent is None and self.rows[0] == self.rows[1]

    def props(self) -> dict:
        return {"routing_agreement": [round(a, 6) for a in self.per_layer], "routing_positions": self.positions,
                "routing_first_divergent_layer": self.first_divergent}

    def text(self) -> str:
        il = self.first_divergent
        rows = "" if self.rows[0] == self.rows[1] else f"; {self.rows[0]} rows routed vs {self.rows[1]}"
        if il is None:
            return f"routing = {self.other}'s on every layer ({self.positions} positions{rows})"
        worst = int(np.argmin(self.per_layer))
        return (f"routing first diverges at layer {il} ({100 * self.per_layer[il]:.1f} % of {self.positions} "
                f"positions agree with {self.other}'s; least at layer {worst}, {100 * self.per_layer[worst]:.1f} %{rows})")


def routing_agreement(a: Sequence[np.ndarray], b: Sequence[np.ndarray], other: str = "the reference") -> RoutingAgreement:
    """Per layer, `a[il]` and `b[il]` (rows, k) selected expert ids compared over the rows
    both have (a layer either side lacks agrees on nothing)."""
    n_a, n_b = (min((len(x) for x in s), default=0) for s in (a, b))
    n = min(n_a, n_b)
    per_layer = []
    for il in range(max(len(a), len(b))):
        if il >= len(a) or il >= len(b) or n == 0:
            per_layer.append(0.0)
            continue
        same = (np.sort(a[il][:n], axis=1) == np.sort(b[il][:n], axis=1)).all(axis=1)
        per_layer.append(float(same.mean()))
    return RoutingAgreement(per_layer, n, (n_a, n_b), other)
