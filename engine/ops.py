"""Non-matmul ops of the forward pass: RMSNorm, NEOX RoPE, attention over the KV cache,
softmax and SwiGLU. Numba kernels parallel over independent outputs only, so the thread
count cannot change a bit; float32 arithmetic written out as ggml's CPU backend does it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .kernel_parts import PARALLEL_ROWS

_U = np.uint64   # an index numba does not wrap around (see engine/kernels.py)


def round_f16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest IEEE half (round to nearest even, as ggml stores F16), as float32:
    numpy's float16 casts' values (a NaN keeps its sign and the payload's top 10 bits), on
    the kernels' threads for a prefill's arrays (rows: positions; from PARALLEL_ROWS on), as
    numpy's serial casts were ~5 % of a two-thread prefill."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    (_round_f16_parallel if x.ndim and x.shape[0] >= PARALLEL_ROWS else _round_f16_serial)(flat, out)
    return out.reshape(x.shape)


_F16_CHUNK = 16384


@njit(cache=True, inline="always")
def _round_f16_span(x, out, i0, i1):
    bits = x.view(np.uint32)
    ob = out.view(np.uint32)
    for i in range(i0, i1):
        b = bits[i]
        a = b & np.uint32(0x7FFFFFFF)
        sign = b & np.uint32(0x80000000)
        if a > np.uint32(0x7F800000):        # NaN: quiet, top 10 payload bits (nonzero)
            m = a & np.uint32(0x007FE000)
            ob[i] = sign | np.uint32(0x7F800000) | (m if m != 0 else np.uint32(0x2000))
        elif a >= np.uint32(0x477FF000):     # >= 65520: rounds past the largest half, 65504
            ob[i] = sign | np.uint32(0x7F800000)
        elif a >= np.uint32(0x38800000):     # normal half: 10 fraction bits, ties to even
            r = a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))
            ob[i] = sign | (r & np.uint32(0xFFFFE000))
        else:                                # subnormal half: a multiple of 2^-24, ties to even
            v = np.float32(np.rint(np.float32(x[i] * np.float32(16777216.0))))
            out[i] = np.float32(v * np.float32(5.9604644775390625e-08))


@njit(cache=True)
def _round_f16_serial(x, out):
    _round_f16_span(x, out, 0, x.shape[0])


@njit(cache=True, parallel=True)
def _round_f16_parallel(x, out):
    n = x.shape[0]
    for c in prange((n + _F16_CHUNK - 1) // _F16_CHUNK):
        _round_f16_span(x, out, c * _F16_CHUNK, min(n, (c + 1) * _F16_CHUNK))


@njit(cache=True)
def rms_norm(x, w, eps):
    """y = x / sqrt(mean(x^2) + eps) * w per row; the sum of squares in double (ggml).
    Serial: a row is microseconds of work, less than waking a second thread."""
    n, k = x.shape
    y = np.empty_like(x)
    for i in range(n):
        s = 0.0
        for j in range(k):
            s += np.float64(x[i, j]) * np.float64(x[i, j])
        mean = np.float32(s / k)
        scale = np.float32(1.0) / np.float32(np.sqrt(mean + np.float32(eps)))
        for j in range(k):
            y[i, j] = np.float32(x[i, j] * scale) * w[j]
    return y


@njit(cache=True)
def rms_norm_heads(x, w, eps):
    """rms_norm over the last axis of (n, heads, D) (serial, as rms_norm)."""
    n, H, D = x.shape
    y = np.empty_like(x)
    for t in range(n * H):
        i, h = t // H, t % H
        s = 0.0
        for j in range(D):
            s += np.float64(x[i, h, j]) * np.float64(x[i, h, j])
        mean = np.float32(s / D)
        scale = np.float32(1.0) / np.float32(np.sqrt(mean + np.float32(eps)))
        for j in range(D):
            y[i, h, j] = np.float32(x[i, h, j] * scale) * w[j]
    return y


def rope_cache(positions: np.ndarray, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin (n, D/2); theta_i = pos * base^(-2i/D) by repeated float32 products, as ggml."""
    scale = np.float32(base) ** np.float32(-2.0 / head_dim)
    theta = np.empty((len(positions), head_dim // 2), dtype=np.float32)
    theta[:, 0] = positions.astype(np.float32)
    for i in range(1, head_dim // 2):
        theta[:, i] = theta[:, i - 1] * scale
    return np.cos(theta), np.sin(theta)


@njit(cache=True)
def rope_neox(x, cos, sin):
    """Rotate pairs (i, i + D/2) of x (n, heads, D) in place."""
    n, H, D = x.shape
    half = D // 2
    for t in range(n):
        for h in range(H):
            for i in range(half):
                x0 = x[t, h, i]
                x1 = x[t, h, i + half]
                x[t, h, i] = x0 * cos[t, i] - x1 * sin[t, i]
                x[t, h, i + half] = x0 * sin[t, i] + x1 * cos[t, i]
    return x


@njit(cache=True, parallel=True)
def attention_probs(q16, k_t, pos0, scale):
    """Softmax(q.k^T * scale + causal mask) for query rows at positions pos0.. over the cache.

    q16 (n, H, D) and the K cache k_t (Hkv, D, ctx) hold f16 values as float32; k_t is
    transposed so that the dots with consecutive keys are consecutive lanes. Each dot
    accumulates d = 0..D-1 in double (ggml_vec_dot_f16 generic; an f16 x f16 product is
    exact in float), softmax as ggml_soft_max. Returns (n, H, n_kv) float32, zero where masked.
    """
    n, H, D = q16.shape
    Hkv = k_t.shape[0]
    group = H // Hkv
    n_kv = pos0 + n
    p = np.zeros((n, H, n_kv), dtype=np.float32)
    for t in prange(n * H):
        # rows zigzag (0, n-1, 1, n-2, ...): row i has pos0 + i + 1 keys, and prange hands each
        # thread a contiguous range of t, which would give the last thread the longest rows
        h, ii = t % H, t // H
        i = ii // 2 if ii % 2 == 0 else n - 1 - ii // 2
        kv = h // group
        keys = pos0 + i + 1  # causal: keys 0..pos0+i
        s = np.zeros(keys, dtype=np.float64)
        for d in range(D):
            qd = np.float64(q16[i, h, d])
            kd = k_t[kv, d]
            for j in range(keys):   # one chain per key: vectorized across keys
                s[_U(j)] += qd * np.float64(kd[_U(j)])
        mx = np.float32(-np.inf)
        for j in range(keys):
            v = np.float32(np.float32(s[j]) * scale)
            p[i, h, j] = v
            if v > mx:
                mx = v
        tot = 0.0
        for j in range(keys):
            e = np.float32(np.exp(np.float64(p[i, h, j] - mx)))  # correctly rounded expf
            p[i, h, j] = e
            tot += np.float64(e)
        inv = np.float32(1.0 / tot)
        for j in range(keys):
            p[i, h, j] = p[i, h, j] * inv
    return p


@njit(cache=True, parallel=True)
def attention_values(p16, v_cache):
    """out (n, H*D) = p16 @ V per head; p16 holds f16-rounded probabilities, the V cache
    (ctx, Hkv, D) f16 values as float32. Each output sums j = 0..n_kv-1 in double (terms
    that cannot change the sum skipped, see below)."""
    n, H, n_kv = p16.shape
    Hkv, D = v_cache.shape[1], v_cache.shape[2]
    group = H // Hkv
    out = np.empty((n, H * D), dtype=np.float32)
    # A zero probability adds 0 * v = +-0 to a sum that is never -0, which changes nothing
    # unless v is inf or NaN: so a row stops after its last nonzero probability (a causal
    # row's masked keys: half a prefill's work) when no value past that is non-finite.
    ends = np.empty((n, H), np.int64)
    for i in range(n):
        for h in range(H):
            end = n_kv
            while end > 0 and p16[i, h, end - 1] == 0:
                end -= 1
            ends[i, h] = end
    last_bad = np.full(Hkv, -1, np.int64)   # only values some row would skip are looked at
    for j in range(ends.min() if n else n_kv, n_kv):
        for kv in range(Hkv):
            for d in range(D):
                if not np.isfinite(v_cache[j, kv, d]):
                    last_bad[kv] = j
    for t in prange(n * H):
        h, ii = t % H, t // H
        i = ii // 2 if ii % 2 == 0 else n - 1 - ii // 2   # zigzag, as attention_probs
        kv = h // group
        end = ends[i, h] if last_bad[kv] < ends[i, h] else n_kv
        s = np.zeros(D, dtype=np.float64)
        for j in range(end):
            pj = np.float64(p16[i, h, j])
            vj = v_cache[j, kv]
            for d in range(D):   # one chain per output: vectorized across outputs
                s[_U(d)] += pj * np.float64(vj[_U(d)])
        for d in range(D):
            out[i, h * D + d] = np.float32(s[d])
    return out


def softmax(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max over the last axis: exp(x - max) in float32, sum in double, scale by 1/sum."""
    e = np.exp(x - x.max(axis=-1, keepdims=True)).astype(np.float32)
    inv = (1.0 / e.sum(axis=-1, keepdims=True, dtype=np.float64)).astype(np.float32)
    return (e * inv).astype(np.float32)


def combine_experts(ey: np.ndarray, at: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The MoE output out[r] = sum_j weights[r, j] * ey[at[r, j]] as ggml adds it: each
    product rounded to float32, then added in selection order j = 0, 1, ... (ey: the experts'
    output rows; at[r, j]: the row of ey holding row r's j-th selected expert). Rows on the
    kernels' threads from PARALLEL_ROWS on."""
    out = np.empty((at.shape[0], ey.shape[1]), np.float32)
    (_combine_parallel if at.shape[0] >= PARALLEL_ROWS else _combine_serial)(ey, at, weights, out)
    return out


@njit(cache=True, inline="always")
def _combine_row(ey, at, weights, out, r):
    w0 = weights[r, 0]
    y0 = ey[at[r, 0]]
    for d in range(ey.shape[1]):
        out[r, d] = np.float32(y0[d] * w0)
    for j in range(1, at.shape[1]):
        w = weights[r, j]
        y = ey[at[r, j]]
        for d in range(ey.shape[1]):
            out[r, d] = np.float32(out[r, d] + np.float32(y[d] * w))


@njit(cache=True)
def _combine_serial(ey, at, weights, out):
    for r in range(at.shape[0]):
        _combine_row(ey, at, weights, out, r)


@njit(cache=True, parallel=True)
def _combine_parallel(ey, at, weights, out):
    for r in prange(at.shape[0]):
        _combine_row(ey, at, weights, out, r)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up in float32."""
    return (gate / (np.float32(1) + np.exp(-gate)) * up).astype(np.float32)
