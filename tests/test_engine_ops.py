"""engine/ops.py's kernels rewritten for speed keep their bits: the f16 rounding is numpy's
float16 cast (the KV cache's and attention's values), the MoE combine is ggml's weighted
sum in selection order, and the causal attention rows give the same bits at 1 and 2
threads (rows are handed to threads zigzagged)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import kernels as K
from engine import ops

SPECIALS = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
                     0x7FA00000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x38800000, 0x387FFFFF, 0x33000000,
                     0x33000001, 0x32FFFFFF, 0x00000001, 0x3F801000, 0x3F803000, 0x3F801001], dtype=np.uint32)


def threads(t):
    return pytest.param(t, marks=pytest.mark.skipif(K.numba.config.NUMBA_NUM_THREADS < t, reason=f"{t} threads"))


@pytest.mark.parametrize("t", [1, threads(2)])
def test_f16_rounding_is_numpys_cast(t):
    rng = np.random.default_rng(7)
    bits = np.concatenate([SPECIALS, rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32),
                           # halves' neighbourhood: ties, subnormals, the overflow edge
                           (rng.integers(0x33000000, 0x47800000, 1 << 18, dtype=np.uint64) & ~np.uint64(0xFFF)
                            | np.uint64(0x1000)).astype(np.uint32)])
    old = K.get_threads()
    try:
        K.set_threads(t)
        for x in (bits.view(np.float32).reshape(-1, 4), bits[:1000].view(np.float32)):   # parallel, serial
            got = ops.round_f16(x)
            with np.errstate(over="ignore", invalid="ignore"):
                want = x.astype(np.float16).astype(np.float32)
            assert got.shape == x.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    finally:
        K.set_threads(old)


@pytest.mark.parametrize("n", [1, 9, 40])   # decode; the serial and the parallel kernel
def test_moe_combine_is_the_weighted_sum_in_selection_order(n):
    rng = np.random.default_rng(3)
    k, dim = 4, 64
    ey = rng.standard_normal((n * k, dim)).astype(np.float32) * np.float32(1e3)
    at = rng.permutation(n * k).reshape(n, k)
    w = rng.random((n, k)).astype(np.float32)
    got = ops.combine_experts(ey, at, w)
    y = ey[at] * w[:, :, None]
    want = y[:, 0].copy()
    for j in range(1, k):
        want += y[:, j]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # a different order of addition changes bits here, so the order is what is pinned
    assert not np.array_equal(got, y[:, ::-1].sum(axis=1, dtype=np.float32))


@pytest.mark.parametrize("n, pos0", [(1, 0), (7, 0), (13, 5), (64, 3)])
def test_causal_attention_rows_have_the_same_bits_at_any_thread_count(n, pos0):
    rng = np.random.default_rng(n)
    H, Hkv, D = 4, 2, 32
    q = ops.round_f16(rng.standard_normal((n, H, D)).astype(np.float32))
    k_t = ops.round_f16(rng.standard_normal((Hkv, D, pos0 + n + 4)).astype(np.float32))
    old = K.get_threads()
    try:
        K.set_threads(1)
        one = ops.attention_probs(q, k_t, pos0, np.float32(0.125))
        K.set_threads(min(2, K.numba.config.NUMBA_NUM_THREADS))
        two = ops.attention_probs(q, k_t, pos0, np.float32(0.125))
    finally:
        K.set_threads(old)
    assert np.array_equal(one.view(np.uint32), two.view(np.uint32))
    for i in range(n):   # causal: row i sees keys 0..pos0 + i, a distribution over them
        assert np.all(one[i, :, pos0 + i + 1:] == 0) and np.allclose(one[i].sum(axis=-1), 1, atol=1e-5)


@pytest.mark.parametrize("bad", [None, np.inf, -np.inf, np.nan])
def test_attention_values_skip_only_terms_that_cannot_change_a_sum(bad):
    """Values past a row's last nonzero probability are skipped only while they are finite:
    a masked key's inf or NaN value turns that row's output NaN, as in ggml's full sum."""
    rng = np.random.default_rng(11)
    n, H, Hkv, D = 6, 4, 2, 16
    p = ops.round_f16(rng.random((n, H, n)).astype(np.float32))
    p *= np.tril(np.ones((n, n), np.float32))[:, None, :]          # causal: zero past the diagonal
    p[2, 1, 1] = -0.0                                                  # a negative zero inside
    v = ops.round_f16(rng.standard_normal((n, Hkv, D)).astype(np.float32))
    if bad is not None:
        v[4, 1, 3] = bad                                                # a masked key of rows 0-3
    got = ops.attention_values(p, v)
    want = np.empty((n, H * D), np.float32)
    with np.errstate(invalid="ignore"):
        for i in range(n):
            for h in range(H):
                s = np.zeros(D)
                for j in range(n):   # every term, in order, as ggml
                    s += np.float64(p[i, h, j]) * v[j, h // (H // Hkv)].astype(np.float64)
                want[i, h * D:(h + 1) * D] = s.astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    if bad is not None:   # 0 * inf or 0 * NaN: rows 0-3, whose key 4 is masked, are NaN at its column
        assert nan[:4, 2 * D + 3].all() and nan[:4, 3 * D + 3].all() and not nan[:4, :2 * D].any()
    else:
        assert not nan.any()
