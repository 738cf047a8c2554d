"""Reference whole-model forward for qwen3moe, in the order of llama.cpp's graph
(src/models/qwen3moe.cpp; the numerics in docs/CORRECTNESS.md).

Numerics follow llama.cpp's CPU backend where they change results: activations quantized
before every quantized product, RMSNorm sums in double, per-head q/k norm before NEOX RoPE,
and an F16 KV cache (Q, K, V and the softmax probabilities rounded to f16). The whole
prompt is one batch with a causal mask, so no KV cache is kept.

`Forward` is the result of both architectures' forwards (qwen35moe: .qwen35moe).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..gguf.file import ModelFile
from .deltanet import DeltaNetState
from .moe import MoEResult, moe_layer
from .ops import attention, linear, rms_norm, rope_neox, weights_f32
from .quants import dequantize


@dataclass
class Forward:
    logits: np.ndarray                                       # (n, n_vocab) float32
    moe_in: list[np.ndarray] = field(default_factory=list)   # per layer: the MoE's (ffn-normed) input
    moe: list[MoEResult] = field(default_factory=list)       # per layer: routed experts' routing and output
    shared: list[np.ndarray] = field(default_factory=list)   # per layer: gated shared expert (qwen35moe)
    mixer_out: list[np.ndarray] = field(default_factory=list)  # per layer: attention / delta-net output
    layer_out: list[np.ndarray] = field(default_factory=list)  # per layer: residual stream after the layer
    # position -> delta-net layer -> its state after that position (qwen35moe)
    states: dict[int, dict[int, DeltaNetState]] = field(default_factory=dict)

    def add_layer(self, mixer_out, moe_in, moe, layer_out, shared=None) -> None:
        self.mixer_out.append(mixer_out)
        self.moe_in.append(moe_in)
        self.moe.append(moe)
        self.layer_out.append(layer_out)
        if shared is not None:
            self.shared.append(shared)


MoEHook = Callable[[int, np.ndarray], None]


class ReferenceModel:
    square = np.float64   # RMSNorm squares in double, as the bundled qwen3moe engine (ops.rms_norm)
    moe_norm = "ffn_norm.weight"   # the norm of a layer's MoE input

    def __init__(self, mf: ModelFile):
        self.mf = mf
        self.hp = mf.hp

    def _mm(self, name: str, x: np.ndarray) -> np.ndarray:
        return linear(self.mf, name, x)

    def _f32(self, name: str) -> np.ndarray:
        return weights_f32(self.mf, name)

    def moe_input(self, il: int, x: np.ndarray) -> np.ndarray:
        """Layer il's MoE input from the residual stream x: RMS-normed, times its norm weight
        (also what a layer-ahead prediction routes, with the predicted layer's norm)."""
        return (rms_norm(x, self.hp.rms_eps, self.square) * self._f32(f"blk.{il}.{self.moe_norm}")).astype(np.float32)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        t = self.mf.tensor("token_embd.weight")
        return dequantize(np.asarray(self.mf.raw(t.name)[tokens]), t.qtype)

    def head(self, x: np.ndarray) -> np.ndarray:
        """Logits: the output matrix (or the tied embedding) times the output-normed state."""
        h = (rms_norm(x, self.hp.rms_eps, self.square) * self._f32("output_norm.weight")).astype(np.float32)
        return self._mm("output.weight" if "output.weight" in self.mf.tensors else "token_embd.weight", h)

    def forward(self, tokens, moe_hook: MoEHook | None = None) -> Forward:
        """Logits for every position of `tokens`. `moe_hook(layer, h)` runs before each
        layer's routing (the model maker uses it to calibrate routers in place)."""
        hp, tokens, sq = self.hp, np.asarray(tokens, dtype=np.int64), self.square
        n, D = len(tokens), hp.head_dim
        pos = np.arange(n)
        result = Forward(logits=np.empty(0))
        x = self.embed(tokens)
        for il in range(hp.n_layer):
            b = f"blk.{il}."
            h = rms_norm(x, hp.rms_eps, sq) * self._f32(b + "attn_norm.weight")
            q = self._mm(b + "attn_q.weight", h).reshape(n, hp.n_head, D)
            k = self._mm(b + "attn_k.weight", h).reshape(n, hp.n_head_kv, D)
            v = self._mm(b + "attn_v.weight", h).reshape(n, hp.n_head_kv, D)
            q = rms_norm(q, hp.rms_eps, sq) * self._f32(b + "attn_q_norm.weight")
            k = rms_norm(k, hp.rms_eps, sq) * self._f32(b + "attn_k_norm.weight")
            q, k = rope_neox(q, pos, hp.rope_base), rope_neox(k, pos, hp.rope_base)
            a = self._mm(b + "attn_output.weight", attention(q, k, v))
            x = (x + a).astype(np.float32)

            h = self.moe_input(il, x)
            if moe_hook is not None:
                moe_hook(il, h)
            moe = moe_layer(self.mf, il, h)
            x = (x + moe.out).astype(np.float32)
            result.add_layer(a, h, moe, x)

        result.logits = self.head(x)
        return result
