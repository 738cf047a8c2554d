"""Reference whole-model forward for qwen3moe, in the order of the graph in ggml-facts.md.

Numerics follow llama.cpp's CPU backend where they change results: activations quantized
before every quantized product, RMSNorm sums in double, per-head q/k norm before NEOX RoPE,
and an F16 KV cache (Q, K, V and the softmax probabilities rounded to f16). The whole
prompt is one batch with a causal mask, so no KV cache is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..gguf.file import ModelFile
from .moe import MoEResult, moe_layer, softmax
from .quants import dequantize, matmul


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float32)
    mean = (np.sum(x.astype(np.float64) ** 2, axis=-1, keepdims=True) / x.shape[-1]).astype(np.float32)
    return (x * (np.float32(1.0) / np.sqrt(mean + np.float32(eps)))).astype(np.float32)


def rope_neox(x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
    """x (n, heads, D): rotate pairs (i, i + D/2) by pos * base^(-2i/D).

    ggml builds theta by repeated float32 multiplication with base^(-2/D); do the same.
    """
    D = x.shape[-1]
    scale = np.float32(base) ** np.float32(-2.0 / D)
    theta = np.empty((len(pos), D // 2), dtype=np.float32)
    theta[:, 0] = pos.astype(np.float32)
    for i in range(1, D // 2):
        theta[:, i] = theta[:, i - 1] * scale
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., : D // 2], x[..., D // 2:]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).astype(np.float32)


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal GQA attention over one batch; q (n, H, D), k/v (n, Hkv, D) -> (n, H*D)."""
    n, H, D = q.shape
    group = H // k.shape[1]
    q16, k16, v16 = f16(q), f16(k), f16(v)
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
    out = np.empty((n, H, D), dtype=np.float32)
    for h in range(H):
        kv = h // group
        scores = (q16[:, h].astype(np.float64) @ k16[:, kv].T.astype(np.float64)).astype(np.float32)
        p = softmax(scores * np.float32(1.0 / np.sqrt(D)) + mask, exp64=True)
        out[:, h] = (f16(p).astype(np.float64) @ v16[:, kv].astype(np.float64)).astype(np.float32)
    return out.reshape(n, H * D)


@dataclass
class Forward:
    logits: np.ndarray                                       # (n, n_vocab) float32
    moe_in: list[np.ndarray] = field(default_factory=list)   # per layer: ffn-normed input
    moe: list[MoEResult] = field(default_factory=list)       # per layer: routing and output


MoEHook = Callable[[int, np.ndarray], None]


class ReferenceModel:
    def __init__(self, mf: ModelFile):
        self.mf = mf
        self.hp = mf.hp

    def _mm(self, name: str, x: np.ndarray) -> np.ndarray:
        return matmul(self.mf.raw(name), self.mf.tensor(name).qtype, x)

    def _f32(self, name: str) -> np.ndarray:
        return np.asarray(self.mf.raw(name)).view(np.float32).reshape(-1)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        t = self.mf.tensor("token_embd.weight")
        return dequantize(np.asarray(self.mf.raw(t.name)[tokens]), t.qtype)

    def forward(self, tokens, moe_hook: MoEHook | None = None) -> Forward:
        """Logits for every position of `tokens`. `moe_hook(layer, h)` runs before each
        layer's routing (the model maker uses it to calibrate routers in place)."""
        hp, tokens = self.hp, np.asarray(tokens, dtype=np.int64)
        n, D = len(tokens), hp.head_dim
        pos = np.arange(n)
        result = Forward(logits=np.empty(0))
        x = self.embed(tokens)
        for il in range(hp.n_layer):
            b = f"blk.{il}."
            h = rms_norm(x, hp.rms_eps) * self._f32(b + "attn_norm.weight")
            q = self._mm(b + "attn_q.weight", h).reshape(n, hp.n_head, D)
            k = self._mm(b + "attn_k.weight", h).reshape(n, hp.n_head_kv, D)
            v = self._mm(b + "attn_v.weight", h).reshape(n, hp.n_head_kv, D)
            q = rms_norm(q, hp.rms_eps) * self._f32(b + "attn_q_norm.weight")
            k = rms_norm(k, hp.rms_eps) * self._f32(b + "attn_k_norm.weight")
            q, k = rope_neox(q, pos, hp.rope_base), rope_neox(k, pos, hp.rope_base)
            x = (x + self._mm(b + "attn_output.weight", attention(q, k, v))).astype(np.float32)

            h = (rms_norm(x, hp.rms_eps) * self._f32(b + "ffn_norm.weight")).astype(np.float32)
            if moe_hook is not None:
                moe_hook(il, h)
            moe = moe_layer(self.mf, il, h)
            result.moe_in.append(h)
            result.moe.append(moe)
            x = (x + moe.out).astype(np.float32)

        h = (rms_norm(x, hp.rms_eps) * self._f32("output_norm.weight")).astype(np.float32)
        head = "output.weight" if "output.weight" in self.mf.tensors else "token_embd.weight"
        result.logits = self._mm(head, h)
        return result
