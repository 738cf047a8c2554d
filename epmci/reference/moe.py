"""Reference MoE: one expert's forward, a whole routed MoE layer and qwen35moe's shared
expert, as ggml's CPU graph (build_moe_ffn, build_ffn in src/llama-graph.cpp).

Expert bytes are read straight from the GGUF by offset (ModelFile.read_expert): a wrong
offset anywhere in the engine's paging shows up as a different result here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from ..gguf.file import ModelFile
from .ops import linear, sigmoid, silu, softmax
from .quants import matmul


def _swiglu_ffn(parts: list[tuple[np.ndarray, Q]], h: np.ndarray) -> np.ndarray:
    """down(silu(gate h) * up h) for rows h; parts = (bytes, type) of gate, up, down."""
    (gw, gt), (uw, ut), (dw, dt) = parts
    h = np.ascontiguousarray(h, dtype=np.float32)
    act = (silu(matmul(gw, gt, h)) * matmul(uw, ut, h)).astype(np.float32)
    return matmul(dw, dt, act)


def expert_forward(mf: ModelFile, layer: int, expert: int, h: np.ndarray) -> np.ndarray:
    """down(silu(gate h) * up h) for rows h (n, n_embd); activations quantized per weight type."""
    return _swiglu_ffn([(mf.read_expert(layer, expert, p), mf.expert_range(layer, expert, p).qtype)
                        for p in ("gate", "up", "down")], h)


def shared_expert(mf: ModelFile, layer: int, h: np.ndarray) -> np.ndarray:
    """qwen35moe's shared expert for rows h, the same input as the routed experts':
    down(silu(gate h) * up h) * sigmoid(ffn_gate_inp_shexp . h), one gate per row."""
    b = f"blk.{layer}."
    y = _swiglu_ffn([(mf.raw(b + f"ffn_{p}_shexp.weight"), mf.tensor(b + f"ffn_{p}_shexp.weight").qtype)
                     for p in ("gate", "up", "down")], h)
    gate = sigmoid(linear(mf, b + "ffn_gate_inp_shexp.weight", np.asarray(h, dtype=np.float32)))  # (n, 1)
    return (y * gate).astype(np.float32)


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
