"""The qwen35moe reference: its delta-net pieces against literal transliterations of ggml's
C loops, its recurrent state (carried across batches, read after any position), the
multi-section RoPE and the shared expert."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from epmci.gguf.file import ModelFile
from epmci.reference import reference_model
from epmci.reference import deltanet as dn
from epmci.reference.moe import shared_expert
from epmci.reference.ops import rope_neox, rope_rotated_pairs
from epmci.synth.presets import PRESETS
from epmci.synth.writer import calibration_tokens

F32 = np.float32


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def c_gated_delta_net(q, k, v, g, beta, S):
    """ggml_compute_forward_gated_delta_net_one_chunk (K = 1, scalar vec ops), one statement
    at a time. q, k (n, H, ds) per value head, v (n, H, ds), g/beta (n, H), S (H, ds, ds) = M."""
    n, H, ds = v.shape
    scale = F32(1.0) / F32(math.sqrt(ds))            # 1.0f / sqrtf(S_v); sqrt of a small int is exact
    out = np.zeros((n, H, ds), F32)
    S = S.copy()
    for j in range(H):
        M = S[j]
        for t in range(n):
            e = np.exp(F32(g[t, j]))                    # expf
            for a in range(ds):
                for i in range(ds):
                    M[a, i] = F32(M[a, i] * e)          # ggml_vec_scale_f32
            delta = [F32(0)] * ds
            for a in range(ds):
                s = 0.0                                 # ggml_float
                for i in range(ds):
                    s += float(F32(M[a, i] * k[t, j, i]))
                delta[a] = F32(F32(v[t, j, a] - F32(s)) * beta[t, j])
            for a in range(ds):
                for i in range(ds):
                    M[a, i] = F32(M[a, i] + F32(k[t, j, i] * delta[a]))   # ggml_vec_mad_f32
            for a in range(ds):
                s = 0.0
                for i in range(ds):
                    s += float(F32(M[a, i] * q[t, j, i]))
                out[t, j, a] = F32(F32(s) * scale)
    return out, S


def test_recurrence_matches_c_transliteration_bitwise():
    rng = np.random.default_rng(0)
    n, H, ds = 5, 3, 8
    q, k, v = (rng.standard_normal((n, H, ds)).astype(F32) for _ in range(3))
    g = -rng.uniform(0.01, 2, (n, H)).astype(F32)
    beta = rng.uniform(0, 1, (n, H)).astype(F32)
    S0 = rng.standard_normal((H, ds, ds)).astype(F32)
    o, S, kept = dn.recurrence(q, k, v, g, beta, S0, keep={2})
    co, cS = c_gated_delta_net(q, k, v, g, beta, S0)
    assert np.array_equal(bits(o), bits(co)) and np.array_equal(bits(S), bits(cS))
    _, S2 = c_gated_delta_net(q[:3], k[:3], v[:3], g[:3], beta[:3], S0)
    assert np.array_equal(bits(kept[2]), bits(S2))


def test_causal_conv_matches_c_transliteration_bitwise():
    """ggml_compute_forward_ssm_conv_f32: per channel, sumf = 0.0f; sumf += s[i] * c[i]."""
    rng = np.random.default_rng(1)
    n, C, kc = 6, 5, 4
    x = rng.standard_normal((n, C)).astype(F32)
    st = rng.standard_normal((C, kc - 1)).astype(F32)
    w = rng.standard_normal((C, kc)).astype(F32)
    y, win = dn.causal_conv(x, st, w)
    full = np.concatenate([st, x.T], axis=1)            # (C, kc-1+n): ggml's conv_x rows
    for t in range(n):
        for c in range(C):
            s = F32(0)
            for i in range(kc):
                s = F32(s + F32(full[c, t + i] * w[c, i]))
            assert bits(y[t, c]) == bits(s)
    assert np.array_equal(win.T, full)


def test_l2_norm_gives_unit_vectors():
    x = np.random.default_rng(2).standard_normal((4, 3, 64)).astype(F32) * F32(5)
    y = dn.l2_norm(x, 1e-6)
    assert np.allclose(np.linalg.norm(y.astype(np.float64), axis=-1), 1.0, atol=1e-6)
    assert np.allclose(y, x / np.linalg.norm(x, axis=-1, keepdims=True), atol=1e-6)


def test_value_heads_tile_the_qk_heads():
    assert dn.qk_head_of_value_head(8, 2).tolist() == [0, 1, 0, 1, 0, 1, 0, 1]


def test_rope_sections_rotate_t_h_w_pairs_and_leave_the_rest():
    """IMROPE with sections (1, 1, 1, 1) over 8 dims: pairs 0-2 are t, h, w (rotated by the
    position), pair 3 is an e pair (position 0: unchanged); dims past n_rot pass through."""
    assert rope_rotated_pairs(8, (1, 1, 1, 1)).tolist() == [True, True, True, False]
    assert rope_rotated_pairs(64, (11, 11, 10, 0)).all()
    x = np.random.default_rng(3).standard_normal((3, 2, 12)).astype(F32)
    pos = np.arange(3) + 5
    y = rope_neox(x, pos, 10000.0, n_rot=8, sections=(1, 1, 1, 1))
    assert np.array_equal(y[..., 8:], x[..., 8:])               # past n_rot
    assert np.array_equal(y[..., [3, 7]], x[..., [3, 7]])       # the e pair (3, 3 + 4)
    plain = rope_neox(x, pos, 10000.0, n_rot=8)                 # every pair rotated
    assert np.array_equal(y[..., [0, 1, 2, 4, 5, 6]], plain[..., [0, 1, 2, 4, 5, 6]])
    assert not np.allclose(plain[..., [3, 7]], x[..., [3, 7]])
    # rotation by theta_i = pos * base^(-2i/R), NEOX pairs (i, i + R/2)
    th = 5 * 10000.0 ** (-2 * 1 / 8)
    want = x[0, 0, 1] * np.cos(th) - x[0, 0, 5] * np.sin(th)
    assert abs(float(plain[0, 0, 1]) - want) < 1e-5


@pytest.fixture(scope="module")
def tiny35(tiny35_model):
    return ModelFile(tiny35_model)


def test_deltanet_state_carries_across_batches_bitwise(tiny35):
    """The layer from a saved state continues exactly where it stopped (as llama.cpp's
    recurrent memory between ubatches), and the state has llama.cpp's shapes."""
    ssm = tiny35.hp.ssm
    h = np.random.default_rng(4).standard_normal((9, tiny35.hp.n_embd)).astype(F32)
    whole = dn.deltanet_layer(tiny35, 0, h, keep={3})
    first = dn.deltanet_layer(tiny35, 0, h[:4])
    rest = dn.deltanet_layer(tiny35, 0, h[4:], first.state)
    assert np.array_equal(bits(np.concatenate([first.out, rest.out])), bits(whole.out))
    assert np.array_equal(bits(rest.state.ssm), bits(whole.state.ssm))
    assert np.array_equal(bits(rest.state.conv), bits(whole.state.conv))
    assert np.array_equal(bits(whole.states[3].ssm), bits(first.state.ssm))
    assert np.array_equal(bits(whole.states[3].conv), bits(first.state.conv))
    assert whole.state.conv.shape == (ssm.conv_dim, ssm.conv_kernel - 1)
    assert whole.state.ssm.shape == (ssm.time_step_rank, ssm.state_size, ssm.state_size)
    assert np.abs(whole.state.ssm).max() > 0


def test_forward_exposes_state_after_a_position_and_is_causal(tiny35):
    tokens = calibration_tokens(PRESETS["tiny35"], 0)[:12]
    ref = reference_model(tiny35)
    full = ref.forward(tokens, state_after=[6])
    short = ref.forward(tokens[:7])
    deltanet_layers = [il for il in range(tiny35.hp.n_layer) if tiny35.hp.is_recurrent(il)]
    assert sorted(full.states) == [6, 11] and sorted(full.states[6]) == deltanet_layers
    for il in deltanet_layers:
        assert np.array_equal(bits(full.states[6][il].ssm), bits(short.states[6][il].ssm))
        assert np.array_equal(bits(full.states[6][il].conv), bits(short.states[6][il].conv))
    assert np.array_equal(bits(full.logits[:7]), bits(short.logits))
    n_layer = tiny35.hp.n_layer
    assert len(full.moe) == len(full.shared) == len(full.mixer_out) == len(full.layer_out) == n_layer
    # the residual stream: each layer adds its mixer output and its (routed + shared) FFN
    x_prev = full.layer_out[0]
    mid = (full.mixer_out[1] + x_prev).astype(F32)
    assert np.array_equal(bits(((full.moe[1].out + full.shared[1]) + mid).astype(F32)), bits(full.layer_out[1]))


def test_shared_expert_is_the_gated_swiglu_ffn(tiny35):
    """Against float64 math on gguf-py's dequantized weights: equal up to the activations'
    Q8_K quantization (the reference quantizes them as ggml does)."""
    h = np.random.default_rng(5).standard_normal((6, tiny35.hp.n_embd)).astype(F32)

    def w(name):
        t = tiny35.tensor(name)
        return gguf_dequantize(np.asarray(tiny35.raw(name)), t.qtype).astype(np.float64)
    b = "blk.1."
    h64 = h.astype(np.float64)
    gate, up = h64 @ w(b + "ffn_gate_shexp.weight").T, h64 @ w(b + "ffn_up_shexp.weight").T
    y = (gate / (1 + np.exp(-gate)) * up) @ w(b + "ffn_down_shexp.weight").T
    y *= 1 / (1 + np.exp(-(h64 @ w(b + "ffn_gate_inp_shexp.weight").reshape(-1, 1))))
    ours = shared_expert(tiny35, 1, h)
    assert np.abs(ours - y).max() < 0.02 * np.abs(y).max()
    assert np.abs(y).max() > 0
