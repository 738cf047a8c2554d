"""The ops qwen35moe's forward (engine/qwen35moe.py) needs beyond engine/ops.py, as ggml's
CPU backend computes them:

* RMSNorm with float32 squares summed in double (ggml_compute_forward_rms_norm_f32:
  `sum += (ggml_float)(x[i]*x[i])`). engine/ops.rms_norm squares in double, which the
  qwen3moe engine keeps for bit-compatibility with its baselines; the qwen35moe reference
  follows ggml, so this engine does too.
* sigmoid, silu and softplus as float32 NumPy ufuncs, in the reference's order of
  operations: exp has no bit-exact definition across libraries (libm, NumPy's SIMD exp,
  LLVM), so engine and reference must call the same function to agree bit for bit.
* the multi-section RoPE table (which pairs rotate with the position).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import ops

F32 = np.float32


@njit(cache=True)
def rms_norm(x, w, eps):
    """y = x / sqrt(mean(x^2) + eps) * w per row of x (n, k): float32 squares summed in
    double in element order, the mean rounded to float32, scale = 1/sqrtf(mean + eps),
    y = (x * scale) * w. Serial, as engine/ops.rms_norm: a row is less work than waking a
    second thread."""
    n, k = x.shape
    y = np.empty_like(x)
    for i in range(n):
        s = 0.0
        for j in range(k):
            s += np.float64(x[i, j] * x[i, j])
        mean = np.float32(s / k)
        scale = np.float32(1.0) / np.float32(np.sqrt(mean + np.float32(eps)))
        for j in range(k):
            y[i, j] = np.float32(x[i, j] * scale) * w[j]
    return y


def rms_norm_heads(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """rms_norm over the last axis of (..., D), one weight vector for every head."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return rms_norm(x.reshape(-1, x.shape[-1]), w, eps).reshape(x.shape)


def l2_norm_heads(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis, as llama.cpp computes it
    (build_gdn_l2_norm): rms_norm(x, eps/n) * (1/sqrtf(n)), n the axis length."""
    n = F32(x.shape[-1])
    w = np.full(x.shape[-1], F32(1) / np.sqrt(n), dtype=np.float32)
    return rms_norm_heads(x, w, F32(eps) / n)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + expf(-x)) (ggml_vec_sigmoid_f32)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return (F32(1) / (F32(1) + np.exp(-x))).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    """x / (1 + expf(-x)) (ggml_silu_f32)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return (x / (F32(1) + np.exp(-x))).astype(np.float32)


def softplus(x: np.ndarray) -> np.ndarray:
    """x if x > 20, else logf(1 + expf(x)) (op_softplus)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    with np.errstate(over="ignore"):
        soft = np.log(F32(1) + np.exp(x))
    return np.where(x > F32(20), x, soft).astype(np.float32)


def rotated_pairs(n_rot: int, sections: tuple[int, ...]) -> np.ndarray:
    """Which of the n_rot/2 RoPE pairs rotate with the token position (IMROPE,
    ggml_mrope_cache_init): pair i lies in sector c = i % sum(sections) and is a t, h or w
    pair when c % 3 == 0, 1, 2 and c < 3 * sections[0], [1], [2]; the others are e pairs,
    whose position is 0 for text (they do not rotate)."""
    i = np.arange(n_rot // 2)
    if not sections:
        return np.ones(len(i), dtype=bool)
    c = i % sum(sections)
    return np.logical_or.reduce([(c % 3 == s) & (c < 3 * sections[s]) for s in range(3)])


def rope_cache(positions: np.ndarray, n_rot: int, base: float,
               sections: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin (n, n_rot/2) of partial multi-section RoPE: ops.rope_cache over the first
    n_rot dims, with theta 0 (cos 1, sin 0) for the pairs that do not rotate."""
    cos, sin = ops.rope_cache(positions, n_rot, base)
    still = ~rotated_pairs(n_rot, sections)
    cos[:, still], sin[:, still] = F32(1), F32(0)
    return cos, sin
