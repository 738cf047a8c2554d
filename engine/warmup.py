"""The kernels a forward pass calls, compiled (or loaded from numba's cache) before the
first timed token.

numba prepares a jitted function on its first call, so without this the first micro-batch
of a prefill paid for loading every kernel: on bench at -t 1 a 119-token prefill took
1.74 s in a fresh process and 1.24 s once loaded, i.e. the prefill tok/s measured model
start-up as much as prefill. The warm-up runs one throwaway forward pass of the model's
own code on its real resident weights, with every expert zero (valid blocks of every type),
twice: two positions (decode's serial kernels) and PARALLEL_ROWS positions (the kernels a
prefill's micro-batch runs on every thread): the same functions with the same argument
types as a real pass, so no kernel is prepared later; at each layer start it also runs the pager's expert
prediction (a pure function) on the pass's hidden state, as the pager's begin_layer does.
It never touches the engine's expert store, so no paging counter and no output changes;
it costs start-up the time the first prefill no longer pays.
"""

from __future__ import annotations

import numpy as np

from .gguf_model import EXPERT_PARTS, GGUFModel
from .kernel_parts import PARALLEL_ROWS
from .model import ResidentExperts


class ZeroExperts(ResidentExperts):
    """Experts that are all the same zero matrices (one per shape, broadcast over a layer's
    experts); at each layer start `predictor` (engine.paging.prefetch.Predictor) runs, if
    one is given."""

    def __init__(self, gm: GGUFModel, predictor=None):
        self.predictor = predictor
        zeros: dict[tuple, np.ndarray] = {}

        def experts(t) -> np.ndarray:
            key = (t.data.shape[1:], t.data.dtype.str)
            if key not in zeros:
                zeros[key] = np.zeros(t.data.shape[1:], t.data.dtype)
            return np.broadcast_to(zeros[key], t.data.shape)
        self.parts = [[experts(gm.layer(il, f"ffn_{p}_exps")) for p in EXPERT_PARTS] for il in range(gm.hp.n_layer)]

    def begin_layer(self, il: int, x: np.ndarray) -> None:
        if self.predictor is not None:
            self.predictor.predict(il, x)


def warm_up(forward, gm: GGUFModel, predictor=None) -> None:
    """Forward passes of 2 and of PARALLEL_ROWS tokens through throwaway `forward` models
    (their own caches; the logits of one position), the pager's `predictor` (None: no
    prefetch) run at every layer start."""
    for n in (2, PARALLEL_ROWS):
        forward(gm, ZeroExperts(gm, predictor), n_ctx=n).forward(np.zeros(n, dtype=np.int64), 1)
