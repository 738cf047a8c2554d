"""Router calibration: make the calibration prompt route to every expert of every layer.

Random routers leave a few experts unused over 64 tokens (about e^-4 of them at 64
experts, top-4), and an expert that is never routed is never paged: its offset, slot and
quant type would go untested. Layer by layer, in the reference forward, each unused
expert's router row is pointed at one token's MoE input so that the token selects it,
taking the token whose k-th pick is shared with another token so nothing new goes unused.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from ..gguf.file import ModelFile
from ..reference import reference_model
from ..reference.moe import route, router_logits
from ..reference.ops import softmax

MARGIN = 1.0      # logit lead of the forced expert over the token's previous best
MAX_ROUNDS = 64


def calibrate_router(path: str | os.PathLike, tokens: np.ndarray,
                     layer_done: Callable[[int], None] = lambda layer: None) -> None:
    mf = ModelFile(path)
    X, E, K = mf.hp.n_expert, mf.hp.n_embd, mf.hp.n_expert_used

    def hook(layer: int, h: np.ndarray) -> None:
        t = mf.tensor(f"blk.{layer}.ffn_gate_inp.weight")
        w = np.memmap(mf.path, dtype=np.float32, mode="r+", offset=t.offset, shape=(X, E))
        for _ in range(MAX_ROUNDS):
            logits = router_logits(mf, layer, h)
            selected, _ = route(softmax(logits), K)
            counts = np.bincount(selected.ravel(), minlength=X)
            unused = np.nonzero(counts == 0)[0]
            if not len(unused):
                break
            donors = [i for i in np.argsort(-counts[selected[:, -1]], kind="stable")
                      if counts[selected[i, -1]] >= 2]
            for e, i in zip(unused, donors):
                norm = float(np.linalg.norm(h[i].astype(np.float64)))
                target = float(logits[i].max()) + MARGIN
                w[e] = (h[i].astype(np.float64) * (target / norm**2)).astype(np.float32)
            w.flush()
        else:
            raise RuntimeError(f"router calibration did not converge on layer {layer}")
        del w
        layer_done(layer)

    reference_model(mf).forward(tokens, moe_hook=hook)
