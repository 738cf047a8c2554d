"""The elementwise and normalisation ops both reference forwards share, as ggml's CPU backend
computes them (ggml/src/ggml-cpu/ops.cpp, vec.h, unary-ops.cpp), and `linear`: a weight of
the model file times activations (quants.matmul).

Every op is float32 in the C's order, one rounding per operation (no FMA contraction).
exp and log are NumPy's float32 ufuncs (libm's expf/logf in the C), except attention's
softmax, which takes exp in double and rounds once; an engine that must be bit-exact with
the reference calls the same functions.
"""

from __future__ import annotations

import numpy as np

from ..gguf.file import ModelFile
from .quants import matmul

F32 = np.float32


def linear(mf: ModelFile, name: str, x: np.ndarray) -> np.ndarray:
    """x (n, k) times the 2-D weight `name` (k values per row), read from the file by offset."""
    t = mf.tensor(name)
    return matmul(mf.raw(name).reshape(-1, t.row_bytes), t.qtype, x)


def weights_f32(mf: ModelFile, name: str) -> np.ndarray:
    """An F32 tensor's values, flat (norm weights, ssm_a, ssm_dt.bias, conv1d)."""
    return np.asarray(mf.raw(name)).view(np.float32).reshape(-1)


def rms_norm(x: np.ndarray, eps: float, square=np.float32) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis (ggml_compute_forward_rms_norm_f32):
    squares summed in double in element order, the mean cast to float, scale =
    1/sqrtf(mean + eps), y = x * scale. ggml squares in float32 (`(ggml_float)(x*x)`);
    `square=np.float64` squares in double, as the bundled qwen3moe engine does (kept there
    so the two stay bit-identical; the mean can differ from ggml's in its last bit)."""
    x = x.astype(np.float32)
    xs = x.astype(square)
    total = np.cumsum((xs * xs).astype(np.float64), axis=-1)[..., -1:]   # sequential, as the loop
    mean = (total / x.shape[-1]).astype(np.float32)
    return (x * (F32(1.0) / np.sqrt(mean + F32(eps)))).astype(np.float32)


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    """ggml_silu_f32: x / (1 + expf(-x))."""
    x = x.astype(np.float32)
    return (x / (F32(1) + np.exp(-x))).astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """ggml_vec_sigmoid_f32: 1 / (1 + expf(-x))."""
    x = x.astype(np.float32)
    return (F32(1) / (F32(1) + np.exp(-x))).astype(np.float32)


def softplus(x: np.ndarray) -> np.ndarray:
    """op_softplus (unary-ops.cpp): x if x > 20, else logf(1 + expf(x))."""
    x = x.astype(np.float32)
    with np.errstate(over="ignore"):
        soft = np.log(F32(1) + np.exp(x))
    return np.where(x > F32(20), x, soft).astype(np.float32)


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


def rope_rotated_pairs(n_rot: int, sections: tuple[int, ...] = ()) -> np.ndarray:
    """Which of the n_rot/2 pairs rotate with the token position (bool per pair).

    Plain RoPE: all. Multi-section IMROPE (ggml_mrope_cache_init, is_imrope): pair i lies in
    sector c = i % sum(sections) and is a t, h or w pair when c % 3 == 0, 1, 2 and c < 3 *
    sections[0], [1], [2]; the rest are e pairs. For text llama.cpp gives t, h and w the
    token position and e position 0, so e pairs get theta 0 (cos 1, sin 0)."""
    i = np.arange(n_rot // 2)
    if not sections:
        return np.ones(len(i), dtype=bool)
    c = i % sum(sections)
    return np.logical_or.reduce([(c % 3 == s) & (c < 3 * sections[s]) for s in range(3)])


def rope_neox(x: np.ndarray, pos: np.ndarray, base: float, n_rot: int | None = None,
              sections: tuple[int, ...] = ()) -> np.ndarray:
    """x (n, heads, D): rotate pairs (i, i + R/2), i < R/2 = n_rot/2, by theta_i =
    pos * base^(-2i/R); dims [R, D) pass through (ggml_compute_forward_rope_flt, NEOX and
    IMROPE modes). ggml builds theta by repeated float32 multiplication with base^(-2/R);
    do the same. `sections`: see rope_rotated_pairs."""
    D = x.shape[-1]
    R = D if n_rot is None else n_rot
    scale = np.float32(base) ** np.float32(-2.0 / R)
    theta = np.empty((len(pos), R // 2), dtype=np.float32)
    theta[:, 0] = pos.astype(np.float32)
    for i in range(1, R // 2):
        theta[:, i] = theta[:, i - 1] * scale
    theta[:, ~rope_rotated_pairs(R, sections)] = 0
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., : R // 2], x[..., R // 2: R]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos, x[..., R:]], axis=-1).astype(np.float32)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal GQA attention over one batch; q (n, H, D), k/v (n, Hkv, D) -> (n, H*D).
    F16 KV cache and flash attention off: Q, K, V and the probabilities rounded to f16,
    scores and softmax in float32, kq_scale = 1/sqrtf(D); query head h reads KV head
    h // (H/Hkv) (ggml_mul_mat broadcast)."""
    n, H, D = q.shape
    group = H // k.shape[1]
    q16, k16, v16 = f16(q), f16(k), f16(v)
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
    kq_scale = F32(1.0) / np.sqrt(F32(D))
    out = np.empty((n, H, D), dtype=np.float32)
    for h in range(H):
        kv = h // group
        scores = (q16[:, h].astype(np.float64) @ k16[:, kv].T.astype(np.float64)).astype(np.float32)
        p = softmax(scores * kq_scale + mask, exp64=True)
        out[:, h] = (f16(p).astype(np.float64) @ v16[:, kv].astype(np.float64)).astype(np.float32)
    return out.reshape(n, H * D)
