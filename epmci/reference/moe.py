"""Reference MoE: one expert's forward and a whole routed MoE layer, as ggml's CPU graph.

Expert bytes are read straight from the GGUF by offset (ModelFile.read_expert): a wrong
offset anywhere in the engine's paging shows up as a different result here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from ..gguf.file import ModelFile
from .quants import matmul


def silu(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    return (x / (np.float32(1) + np.exp(-x))).astype(np.float32)


def softmax(x: np.ndarray, exp64: bool = False) -> np.ndarray:
    """ggml_soft_max over the last axis: exp(x - max) in float32, sum in double, scale by 1/sum.

    exp64: take exp in double and round once (a correctly rounded expf), instead of
    NumPy's float32 SIMD exp, which may be 1 ulp off.
    """
    x = x.astype(np.float32)
    z = x - x.max(axis=-1, keepdims=True)
    e = (np.exp(z.astype(np.float64)) if exp64 else np.exp(z)).astype(np.float32)
    inv = (1.0 / e.sum(axis=-1, keepdims=True, dtype=np.float64)).astype(np.float32)
    return (e * inv).astype(np.float32)


def expert_forward(mf: ModelFile, layer: int, expert: int, h: np.ndarray) -> np.ndarray:
    """down(silu(gate h) * up h) for rows h (n, n_embd); activations quantized per weight type."""
    h = np.ascontiguousarray(h, dtype=np.float32)
    gate = matmul(mf.read_expert(layer, expert, "gate"), mf.expert_range(layer, expert, "gate").qtype, h)
    up = matmul(mf.read_expert(layer, expert, "up"), mf.expert_range(layer, expert, "up").qtype, h)
    act = (silu(gate) * up).astype(np.float32)
    return matmul(mf.read_expert(layer, expert, "down"), mf.expert_range(layer, expert, "down").qtype, act)


def router_logits(mf: ModelFile, layer: int, h: np.ndarray) -> np.ndarray:
    """W_gate_inp h for rows h; the router is F32, read from the file on every call."""
    w = mf.raw(f"blk.{layer}.ffn_gate_inp.weight").view(np.float32)
    return matmul(np.ascontiguousarray(w).view(np.uint8), Q.F32, np.asarray(h, dtype=np.float32))


@dataclass
class MoEResult:
    out: np.ndarray       # (n, n_embd) float32
    selected: np.ndarray  # (n, k) int32, in selection (descending probability) order
    weights: np.ndarray   # (n, k) float32, renormalized


def route(probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """top-k by probability (stable on ties: lower expert id first), weights renormalized."""
    selected = np.argsort(-probs, axis=-1, kind="stable")[:, :k].astype(np.int32)
    w = np.take_along_axis(probs, selected, axis=-1).astype(np.float32)
    w = (w / w.sum(axis=-1, keepdims=True, dtype=np.float32)).astype(np.float32)
    return selected, w


def moe_layer(mf: ModelFile, layer: int, h: np.ndarray,
              selected: np.ndarray | None = None, weights: np.ndarray | None = None) -> MoEResult:
    """The routed MoE block for rows h (the ffn-normed hidden state).

    With `selected`/`weights` given, the routing is taken as is (to recompute an engine's
    dump from its own routing); otherwise it is computed from the router.
    """
    h = np.asarray(h, dtype=np.float32)
    if selected is None:
        selected, weights = route(softmax(router_logits(mf, layer, h)), mf.hp.n_expert_used)
    out = np.zeros_like(h)
    outs = {}
    for e in np.unique(selected):
        rows = np.nonzero((selected == e).any(axis=1))[0]
        outs[int(e)] = (rows, expert_forward(mf, layer, int(e), h[rows]))
    # Weighted sum in selection order, as ggml adds the k expert outputs one by one.
    for slot in range(selected.shape[1]):
        contrib = np.zeros_like(h)
        for e in np.unique(selected[:, slot]):
            rows, y = outs[int(e)]
            mask = selected[rows, slot] == e
            contrib[rows[mask]] = y[mask] * weights[rows[mask], slot][:, None]
        out = (out + contrib).astype(np.float32) if slot else contrib
    return MoEResult(out, selected, weights)
