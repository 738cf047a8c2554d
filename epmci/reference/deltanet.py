"""Reference Gated DeltaNet layer of qwen35moe (linear attention), and its recurrent state.

In graph order (llama_model_qwen35moe::graph::build_layer_attn_linear,
src/models/delta-net-base.cpp, ggml-cpu/ops.cpp), for the attn-normed rows h of one sequence:

1. qkv = W_qkv h (CD = 2*ds*G + ds*V), z = W_gate h (ds*V), beta = sigmoid(W_beta h) (V),
   alpha = W_alpha h (V); g = softplus(alpha + ssm_dt.bias) * ssm_a (<= 0: the log decay).
2. Causal depthwise conv over a window of the last Kc pre-conv qkv rows, oldest first (the
   conv state, zeros at sequence start, then the current row): y[c] = sum_i win[i][c] *
   conv1d[c, i], a float32 sum from i = 0 without FMA (ggml_compute_forward_ssm_conv_f32),
   then silu.
3. q, k (G heads of ds) and v (V heads of ds) split from y; q and k l2-normalised per head as
   llama.cpp does it: rms_norm(x, eps/ds) * (1/sqrtf(ds)) (build_gdn_l2_norm).
4. Value head j uses q/k head j % G (the fused op's iq1 = iv1 % neq1: tiled, not repeated).
5. Per token, per value head, on the F32 state S[i][m] (i key, m value index), exactly
   ggml_compute_forward_gated_delta_net_one_chunk with ggml's scalar vec ops:
   S *= expf(g) (ggml_vec_scale_f32); delta[m] = (v[m] - sum_i S[i][m] k[i]) * beta;
   S[i][m] += k[i] * delta[m] (ggml_vec_mad_f32, product then add); o[m] = (sum_i S[i][m]
   q[i]) * (1/sqrtf(ds)). The sums are ggml_vec_dot_f32's scalar path: float32 products
   summed in double in element order, cast to float. llama.cpp always takes this fused op
   (fused_gdn_ar/ch are set), for one token and for a batch alike.
6. Gated norm per head: (rms_norm(o) * ssm_norm) * silu(z); out = W_ssm_out o (VD -> E).

The state after a token is what llama.cpp keeps between ubatches, in its layout:
conv (CD, Kc-1) = ggml {Kc-1, CD}, the last Kc-1 pre-conv qkv rows per channel, oldest
first; ssm (V, ds, ds) = ggml {ds, ds, V}, ssm[j, m, i] = S_j[i][m] ("stored transposed").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..gguf.file import ModelFile, SsmParams
from .ops import linear, rms_norm, sigmoid, silu, softplus, weights_f32

F32 = np.float32


@dataclass
class DeltaNetState:
    conv: np.ndarray   # (conv_dim, conv_kernel - 1) float32
    ssm: np.ndarray    # (time_step_rank, state_size, state_size) float32, [j, m, i] = S_j[i][m]

    @classmethod
    def zeros(cls, ssm: SsmParams) -> "DeltaNetState":
        return cls(np.zeros((ssm.conv_dim, ssm.conv_kernel - 1), np.float32),
                   np.zeros((ssm.time_step_rank, ssm.state_size, ssm.state_size), np.float32))


@dataclass
class DeltaNetResult:
    out: np.ndarray                                   # (n, n_embd) float32
    state: DeltaNetState                              # after the last row
    states: dict[int, DeltaNetState] = field(default_factory=dict)   # after the asked rows


def _dot_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Scalar ggml_vec_dot_f32 over the last axis: float32 products, double sum in order."""
    return np.cumsum((a * b).astype(np.float64), axis=-1)[..., -1].astype(np.float32)


def causal_conv(qkv: np.ndarray, conv_state: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """qkv (n, CD), state (CD, Kc-1), w (CD, Kc) -> (conv output (n, CD) before silu,
    window (Kc-1+n, CD): the state's rows then qkv's)."""
    n, kc = qkv.shape[0], w.shape[1]
    win = np.concatenate([conv_state.T, qkv], axis=0).astype(np.float32)
    y = F32(0) + win[0:n] * w[:, 0]               # float sumf = 0.0f; sumf += ...
    for i in range(1, kc):
        y = y + win[i:i + n] * w[:, i]
    return y.astype(np.float32), win


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """build_gdn_l2_norm: rms_norm(x, eps/n) * (1/sqrtf(n)) over the last axis (n = its length)."""
    n = F32(x.shape[-1])
    return (rms_norm(x, F32(eps) / n) * (F32(1) / np.sqrt(n))).astype(np.float32)


def qk_head_of_value_head(n_v: int, n_qk: int) -> np.ndarray:
    """Value head j reads q/k head j % G: tiled ("Qwen 3.5: [k0_v0, k1_v1, k0_v2, k1_v3]"),
    where Qwen3-Next repeats each q/k head instead."""
    return np.arange(n_v) % n_qk


def recurrence(q, k, v, g, beta, S, keep=()) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    """The gated delta rule, token after token. q, k (n, V, ds) already mapped to value heads,
    v (n, V, ds), g and beta (n, V), S (V, ds, ds) as [j, m, i]. -> (o (n, V, ds), final S,
    {t: S after row t for t in keep})."""
    n, ds = q.shape[0], q.shape[-1]
    scale = F32(1) / np.sqrt(F32(ds))
    decay = np.exp(g.astype(np.float32))
    o = np.empty_like(v, dtype=np.float32)
    kept = {}
    S = S.astype(np.float32)
    for t in range(n):
        S = S * decay[t][:, None, None]
        delta = ((v[t] - _dot_f32(S, k[t][:, None, :])) * beta[t][:, None]).astype(np.float32)
        S = (S + k[t][:, None, :] * delta[:, :, None]).astype(np.float32)
        o[t] = _dot_f32(S, q[t][:, None, :]) * scale
        if t in keep:
            kept[t] = S.copy()
    return o, S, kept


def deltanet_layer(mf: ModelFile, layer: int, h: np.ndarray, state: DeltaNetState | None = None,
                   keep=()) -> DeltaNetResult:
    """One Gated DeltaNet layer for the rows h (n, n_embd) of one sequence, from `state`
    (zeros: sequence start). `keep`: row indices whose state after them is returned too."""
    ssm, eps = mf.hp.ssm, mf.hp.rms_eps
    V, G, ds, kd = ssm.time_step_rank, ssm.group_count, ssm.state_size, ssm.key_dim
    b = f"blk.{layer}."
    n = h.shape[0]
    state = state or DeltaNetState.zeros(ssm)

    qkv = linear(mf, b + "attn_qkv.weight", h)
    z = linear(mf, b + "attn_gate.weight", h).reshape(n, V, ds)
    beta = sigmoid(linear(mf, b + "ssm_beta.weight", h))
    alpha = linear(mf, b + "ssm_alpha.weight", h)
    g = (softplus(alpha + weights_f32(mf, b + "ssm_dt.bias")) * weights_f32(mf, b + "ssm_a")).astype(np.float32)

    w = weights_f32(mf, b + "ssm_conv1d.weight").reshape(ssm.conv_dim, ssm.conv_kernel)
    y, win = causal_conv(qkv, state.conv, w)
    y = silu(y)
    heads = qk_head_of_value_head(V, G)
    q = l2_norm(y[:, :kd].reshape(n, G, ds), eps)[:, heads]
    k = l2_norm(y[:, kd:2 * kd].reshape(n, G, ds), eps)[:, heads]
    v = y[:, 2 * kd:].reshape(n, V, ds)

    o, S, kept = recurrence(q, k, v, g, beta, state.ssm, keep)

    o = (rms_norm(o, eps) * weights_f32(mf, b + "ssm_norm.weight")).astype(np.float32) * silu(z)
    out = linear(mf, b + "ssm_out.weight", o.reshape(n, V * ds).astype(np.float32))
    kc1 = ssm.conv_kernel - 1

    def conv_after(t: int) -> np.ndarray:          # window rows t+1 .. t+Kc-1 = inputs up to t
        return np.ascontiguousarray(win[t + 1:t + 1 + kc1].T)
    return DeltaNetResult(out, DeltaNetState(conv_after(n - 1), S),
                          {t: DeltaNetState(conv_after(t), s) for t, s in kept.items()})
