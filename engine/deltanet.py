"""Numba kernels of qwen35moe's Gated DeltaNet: the causal conv with its rolling window and
the gated delta rule with its recurrent matrix (ggml-cpu/ops.cpp:
ggml_compute_forward_ssm_conv_f32, ggml_compute_forward_gated_delta_net_one_chunk).

Both carry their state in place from one call to the next, so a sequence evaluated in
micro-batches of any size gives the bits of one token at a time: each step is the same
float32 operations on the same values, in the same order, whatever the batch boundaries.
Both run in parallel over independent outputs only (conv channels, value heads), so the
thread count cannot change a bit. No FMA contraction (numba emits none without fastmath),
every product rounded to float32 before it is added, as the C does.

State layout (llama.cpp's, and the one the contract's state dump carries):
conv (conv_dim, Kc-1): the last Kc-1 pre-conv inputs per channel, oldest first;
ssm (V, ds, ds): ssm[j, m, i] = S_j[i][m] (i key, m value index: "stored transposed").
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


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
    as [j, m, i], updated in place; scale = 1/sqrtf(ds). Per token and row m of S_j:
    S[m] *= decay; delta = (v[m] - sum_i S[m][i] k[i]) * beta; S[m][i] += k[i] * delta;
    o[m] = (sum_i S[m][i] q[i]) * scale -- each sum float32 products accumulated in double in
    element order (scalar ggml_vec_dot_f32). Row m's update reads only row m, so each row is
    finished before the next. Returns o (n, V, ds)."""
    n, V, ds = v.shape
    G = q.shape[1]
    o = np.empty((n, V, ds), dtype=np.float32)
    for j in prange(V):
        g = j % G
        for t in range(n):
            e = decay[t, j]
            b = beta[t, j]
            for m in range(ds):
                acc = 0.0
                for i in range(ds):
                    S[j, m, i] = S[j, m, i] * e
                    acc += np.float64(S[j, m, i] * k[t, g, i])
                delta = np.float32(v[t, j, m] - np.float32(acc)) * b
                acc = 0.0
                for i in range(ds):
                    S[j, m, i] = S[j, m, i] + k[t, g, i] * delta
                    acc += np.float64(S[j, m, i] * q[t, g, i])
                o[t, j, m] = np.float32(acc) * scale
    return o
