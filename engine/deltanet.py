"""Numba kernels of qwen35moe's Gated DeltaNet: the causal conv with its rolling window and
the gated delta rule with its recurrent matrix (ggml-cpu/ops.cpp:
ggml_compute_forward_ssm_conv_f32, ggml_compute_forward_gated_delta_net_one_chunk).

Both carry their state in place from one call to the next, so a sequence evaluated in
micro-batches of any size gives the bits of one token at a time: each step is the same
float32 operations on the same values, in the same order, whatever the batch boundaries.
Both run in parallel over independent outputs only (conv channels, value heads), so the
thread count cannot change a bit. No FMA contraction (numba emits none without fastmath),
every product rounded to float32 before it is added, as the C does.

State layout: conv (conv_dim, Kc-1), the last Kc-1 pre-conv inputs per channel, oldest
first (llama.cpp's); ssm (V, ds, ds) kept as [j, i, m] = S_j[i][m] (i key, m value index).
llama.cpp stores ssm transposed, [j, m, i], and so does the contract's state dump
(engine/qwen35moe.py transposes a copy for it): each of S_j's sums runs over i in order, so
the only vector direction is across m, and in llama.cpp's layout consecutive m are a row
apart (the recurrence 1.7-1.9x faster at one token, 2.6-2.8x at 32 in this layout;
bench/deltanet.py, docs/PERF.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_U = np.uint64   # an index numba does not wrap around (see engine/kernels.py)


@njit(cache=True, parallel=True)
def causal_conv(x, state, w):
    """Depthwise causal conv of x (n, C) over a window of the last Kc inputs per channel,
    oldest first: the Kc-1 of `state` (C, Kc-1), then x's rows. y[t, c] = sum_i
    win[t+i][c] * w[c, i], a float32 sum from i = 0 starting at 0.0f (no bias, before the
    silu). Returns y (n, C); `state` is updated in place to the window after the last row."""
    n, C = x.shape
    kc = w.shape[1]
    h = kc - 1
    y = np.empty((n, C), dtype=np.float32)
    for c in prange(C):
        for t in range(n):
            s = np.float32(0.0)
            for i in range(kc):
                r = t + i   # window row: the state's h rows, then x's
                v = state[c, r] if r < h else x[r - h, c]
                s += v * w[c, i]
            y[t, c] = s
        for j in range(h):   # reads index n + j >= j: never one already overwritten
            r = n + j
            state[c, j] = state[c, r] if r < h else x[r - h, c]
    return y


@njit(cache=True, parallel=True)
def gated_delta_rule(q, k, v, decay, beta, S, scale):
    """The gated delta rule, token after token, for value heads j (in parallel); value head
    j reads q/k head j % G (tiled, as llama.cpp's Qwen 3.5: iq1 = iv1 % neq1).

    q, k (n, G, ds) l2-normed; v (n, V, ds); decay = expf(g) and beta (n, V); S (V, ds, ds)
    as [j, i, m], updated in place; scale = 1/sqrtf(ds). Per token and value index m:
    S[.][m] *= decay; delta[m] = (v[m] - sum_i S[i][m] k[i]) * beta; S[i][m] += k[i] * delta[m];
    o[m] = (sum_i S[i][m] q[i]) * scale -- each sum float32 products accumulated in double in
    key order i = 0, 1, ... (scalar ggml_vec_dot_f32). The sums of different m are
    independent, so they run side by side, m as vector lanes. Returns o (n, V, ds)."""
    n, V, ds = v.shape
    G = q.shape[1]
    o = np.empty((n, V, ds), dtype=np.float32)
    for j in prange(V):
        g = j % G
        acc = np.empty(ds, dtype=np.float64)
        delta = np.empty(ds, dtype=np.float32)
        for t in range(n):
            e = decay[t, j]
            b = beta[t, j]
            acc[:] = 0.0
            for i in range(ds):
                ki = k[t, g, i]
                Si = S[j, i]
                for m in range(ds):
                    s = Si[_U(m)] * e
                    Si[_U(m)] = s
                    acc[_U(m)] += np.float64(s * ki)
            for m in range(ds):
                delta[m] = np.float32(v[t, j, m] - np.float32(acc[m])) * b
                acc[m] = 0.0
            for i in range(ds):
                ki = k[t, g, i]
                qi = q[t, g, i]
                Si = S[j, i]
                for m in range(ds):
                    s = Si[_U(m)] + ki * delta[_U(m)]
                    Si[_U(m)] = s
                    acc[_U(m)] += np.float64(s * qi)
            for m in range(ds):
                o[t, j, m] = np.float32(acc[m]) * scale
    return o
