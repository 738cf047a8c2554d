"""Layer-ahead prefetch: predict a later layer's experts and queue their reads.

At the start of layer L (before its attention), the hidden state x is normed with layer
T's MoE input norm (ffn_norm; qwen35moe: post_attention_norm) and run through layer T's
router, T = L + SDQ_PREFETCH_LAYER_AHEAD (1: the next layer; 0: layer L itself,
overlapping its attention). The top-k experts of every row, in first-use order, are the
prediction.

The queue is logical, so prefetch counters do not depend on I/O timing:

* a prefetch is *outstanding* from the moment its read is issued until a lookup consumes
  it, it is evicted, or it goes stale; at most `cap` (SDQ_PREFETCH_QUEUE) are outstanding;
* predictions that cannot be issued because the cap is reached wait in `pending`, in
  order, and are issued as outstanding ones retire (checked at every layer start);
* a pending prediction for layer T is dropped when layer T's lookup happens (it can no
  longer help that micro-batch);
* `stale` (SDQ_PREFETCH_STALE_TOKENS): a prediction made when the token clock was c is
  dropped -- pending ones discarded, outstanding ones no longer outstanding -- once
  clock - c > stale, the clock advancing by the micro-batch's token count at its end.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .. import kernels as K
from .. import ops
from ..gguf_model import GGUFModel
from .cache_policy import Key


class Predictor:
    """Routing of a layer applied to a hidden state it was not computed for."""

    def __init__(self, gm: GGUFModel):
        # The tensors are looked up at each prediction, not kept: the engine replaces the
        # mapped views with resident copies (GGUFModel.load_resident) after the pager exists.
        self.gm = gm
        self.k, self.eps = gm.hp.n_expert_used, gm.hp.rms_eps

    def predict(self, layer: int, x: np.ndarray) -> np.ndarray:
        """(rows, k) int32: each row's top-k experts of `layer`'s router, selection order."""
        norm = self.gm.tensor(self.gm.ffn_norm_name(layer)).data
        h = ops.rms_norm(np.ascontiguousarray(x, dtype=np.float32), norm, self.eps)
        router = self.gm.layer(layer, "ffn_gate_inp")
        logits = K.matmul(router.data, router.qtype, h)
        return np.argsort(-logits, axis=-1, kind="stable")[:, :self.k].astype(np.int32)


class PrefetchQueue:
    def __init__(self, cap: int, stale: int):
        self.cap = max(0, int(cap))
        self.stale = max(0, int(stale))
        self.pending: deque[tuple[Key, int]] = deque()
        self._pending_keys: set[Key] = set()
        self._waited: set[Key] = set()   # pending keys already counted as queued
        # branch events: predictions that waited because `cap` reads were outstanding
        # (queued), of those the ones issued later (late), and pending predictions discarded
        # by their layer's lookup or by staleness (dropped)
        self.queued = self.late = self.dropped = 0

    def add(self, keys: list[Key], clock: int) -> None:
        for key in keys:
            if key not in self._pending_keys:
                self._pending_keys.add(key)
                self.pending.append((key, clock))

    def pump(self, n_outstanding, issue) -> None:
        """Issue pending predictions in order while fewer than cap are outstanding.
        n_outstanding() -> int; issue(key, born_clock) issues (or declines) one."""
        while self.pending and n_outstanding() < self.cap:
            key, born = self.pending.popleft()
            self._pending_keys.discard(key)
            if key in self._waited:
                self._waited.discard(key)
                self.late += 1
            issue(key, born)
        for key, _ in self.pending:
            if key not in self._waited:
                self._waited.add(key)
                self.queued += 1

    def _keep(self, keep) -> None:
        kept = deque(e for e in self.pending if keep(e))
        self.dropped += len(self.pending) - len(kept)
        self.pending = kept
        self._pending_keys = {k for k, _ in kept}
        self._waited &= self._pending_keys

    def drop_layer(self, layer: int) -> None:
        if any(k[0] == layer for k, _ in self.pending):
            self._keep(lambda e: e[0][0] != layer)

    def expire(self, clock: int) -> None:
        if any(clock - c > self.stale for _, c in self.pending):
            self._keep(lambda e: clock - e[1] <= self.stale)
