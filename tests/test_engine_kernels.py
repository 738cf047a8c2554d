"""Tests of engine/kernels.py: ggml-exact quantization, dot products and dequantization.

Independent checks used here:
* gguf-py (gguf.quants) for dequantization and Q8_0 quantization (bit for bit);
* a NumPy emulation of ggml's *generic C* vec_dot float order (written from
  ggml/src/ggml-cpu/quants.c, vectorized over rows) for bit-exact dot products;
* float64 sums of dequantized weights x dequantized activations for accuracy;
* epmci.reference.quants.matmul (bit for bit).
"""

from __future__ import annotations

import numpy as np
import pytest

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from engine import kernels as K
from engine.gguf_model import SUPPORTED
from engine.qtypes import QTYPES as TABLE

QTYPES = [T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
ALL_MM = [T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.F32]
BPB = {t: GGML_QUANT_SIZES[t] for t in QTYPES}


@pytest.fixture(params=K.KERNEL_PATHS)
def kernel_path(request):
    """Each k-quant kernel path in turn (the portable one is also every CPU's fallback)."""
    if request.param not in K.available_paths():
        pytest.skip(f"this CPU cannot run the {request.param} kernels")
    old = K.kernel_path()
    K.set_kernel_path(request.param)
    yield request.param
    K.set_kernel_path(old)


def test_kernel_paths_are_chosen_by_the_cpu(monkeypatch):
    """auto takes the fastest path the CPU runs; a path it cannot run, or no path at all, is
    a ValueError naming it -- never a kernel that dies on an illegal instruction."""
    old = K.kernel_path()
    try:
        assert K.set_kernel_path("auto") == K.available_paths()[-1]
        assert K.set_kernel_path("portable") == "portable" == K.kernel_path()
        with pytest.raises(ValueError, match="'avx3'.*expected auto or one of portable, avx2, avx512"):
            K.set_kernel_path("avx3")
        with monkeypatch.context() as m:
            m.setattr(K.numba.config, "CPU_NAME", "generic")   # numba not compiling for this host
            assert K.available_paths() == ("portable",)
            assert K.set_kernel_path("auto") == "portable"
            with pytest.raises(ValueError, match="'avx2'.*available: portable"):
                K.set_kernel_path("avx2")
    finally:
        K.set_kernel_path(old)


@pytest.mark.parametrize("features, paths", [
    ({"avx2": True, "f16c": True}, ("portable", "avx2")),
    ({"avx2": True, "f16c": True, "avx512f": True, "avx512vl": True}, ("portable", "avx2")),   # no BW
    ({"avx2": True, "f16c": True, "avx512f": True, "avx512bw": True, "avx512vl": True}, ("portable", "avx2", "avx512")),
    ({"avx2": True, "avx512f": True, "avx512bw": True, "avx512vl": True}, ("portable",)),   # no F16C
])
def test_each_path_needs_its_cpu_features(features, paths, monkeypatch):
    """What a CPU reports decides the paths: AVX-512 only with F, BW and VL on top of AVX2 and
    F16C; a path the CPU lacks is refused by name, so an AVX2-only machine falls back to avx2."""
    import llvmlite.binding
    monkeypatch.setattr(llvmlite.binding, "get_host_cpu_features", lambda: features)
    assert K.available_paths() == paths
    if "avx512" not in paths:
        with pytest.raises(ValueError, match="'avx512'.*does not allow it"):
            K.set_kernel_path("avx512")


def test_each_kernel_path_runs_its_own_kernels(monkeypatch):
    """Choosing a path changes which kernels run (the bit-for-bit tests of the paths would
    pass trivially if "avx2" quietly ran the portable kernels, or "avx512" the 256-bit ones),
    and the engine's "auto"
    takes the fastest path the CPU runs."""
    if "avx2" not in K.available_paths():
        pytest.skip("this CPU runs only the portable kernels")
    import engine.kernels_x86 as A
    calls = []
    for name in ("matmul_kquant", "matmul_kquant_512", "matmul_q8_0", "matmul_f32"):
        good = getattr(A, name)
        monkeypatch.setattr(A, name, lambda *a, good=good, name=name: calls.append(name) or good(*a))
    rng = np.random.default_rng(11)
    x = _activations(rng, 2, 256)
    old = K.kernel_path()
    try:
        for path, want in (("portable", []), ("avx2", ["matmul_kquant", "matmul_q8_0", "matmul_f32"]),
                           ("avx512", ["matmul_kquant_512", "matmul_q8_0", "matmul_f32"])):
            if path not in K.available_paths():
                continue
            calls.clear()
            K.set_kernel_path(path)
            for qtype in (T.Q4_K, T.Q8_0, T.F32):
                K.matmul(rand_weights(rng, qtype, 16, 256), qtype, x)
            assert calls == want, path
    finally:
        K.set_kernel_path(old)


def test_engine_auto_takes_the_fastest_path(tiny_model):
    from engine.runtime import Engine, Options
    old = K.kernel_path()
    try:
        K.set_kernel_path("portable")
        Engine(str(tiny_model), Options(n_ctx=32, pager=False)).close()
        assert K.kernel_path() == K.available_paths()[-1]
    finally:
        K.set_kernel_path(old)


def test_qtype_table_is_ggmls_and_the_loaders():
    """One table of the engine's types: gguf-py's block sizes, ggml-cpu's vec_dot types,
    and exactly the types the loader accepts."""
    assert set(SUPPORTED) == set(TABLE) == set(ALL_MM)
    vec_dot = {T.F32: T.F32, T.Q8_0: T.Q8_0, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K, T.Q6_K: T.Q8_K}
    for code, t in TABLE.items():
        assert (t.block_values, t.block_bytes) == GGML_QUANT_SIZES[T(code)], t
        assert t.name == T(code).name and t.vec_dot_type == vec_dot[T(code)], t


# ----------------------------------------------------------------- random weights

def _rand_f16(rng, shape, lo=None, hi=None, finite_any=False):
    """Random f16 bit patterns: any finite value, or uniform in [lo, hi)."""
    if finite_any:
        u = rng.integers(0, 1 << 16, size=shape, dtype=np.uint32).astype(np.uint16)
        exp = (u >> 10) & 0x1F
        u = np.where(exp == 31, u & 0x83FF, u).astype(np.uint16)  # inf/nan -> subnormal/zero
        return u.view(np.float16)
    return rng.uniform(lo, hi, size=shape).astype(np.float16)


def rand_weights(rng, qtype, rows, k, finite_any=False):
    """Random valid rows of qtype. finite_any: f16 fields take any finite value (incl.
    negative, subnormal, huge); otherwise scales are realistic positive values."""
    if qtype == T.F32:
        return rng.standard_normal((rows, k)).astype(np.float32)
    bs, ts = BPB[qtype]
    nb = k // bs
    w = rng.integers(0, 256, size=(rows, nb, ts), dtype=np.uint16).astype(np.uint8)

    def put(off, vals):
        w[:, :, off:off + 2] = vals.reshape(rows, nb, 1).view(np.uint8).reshape(rows, nb, 2)

    f = lambda lo, hi: _rand_f16(rng, (rows, nb), lo, hi, finite_any)
    if qtype == T.Q8_0:
        put(0, f(-0.02, 0.02))
    elif qtype in (T.Q4_K, T.Q5_K):
        put(0, f(1e-4, 2e-3))
        put(2, f(1e-4, 2e-3))
    else:  # Q6_K: d @208
        put(208, f(1e-4, 2e-3))
    return w.reshape(rows, nb * ts)


# ----------------------------------------------------------------- NumPy emulation of the C

def _f16le(b):
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)[..., 0]


def _unpack_k(w, qtype, k):
    """-> (ws int64[rows, nb, 256] = scale*q, xd f32[rows, nb], xm f32[rows, nb] | None,
    mins int64[rows, nb, 8] | None, absw f64 [rows, k] = |d*sc*q| + |dmin*m|)."""
    rows = w.shape[0]
    bs, ts = BPB[qtype]
    nb = k // bs
    b = w.reshape(rows, nb, ts)
    if qtype in (T.Q4_K, T.Q5_K):
        xd, xm = _f16le(b[:, :, 0:2]), _f16le(b[:, :, 2:4])
        sc, mn = gq.Q4_K.get_scale_min(b[:, :, 4:16].reshape(-1, 12))
        sc = sc.reshape(rows, nb, 8).astype(np.int64)
        mn = mn.reshape(rows, nb, 8).astype(np.int64)
        qs = b[:, :, 16:144] if qtype == T.Q4_K else b[:, :, 48:176]
        q = np.empty((rows, nb, 256), np.int64)
        for c in range(4):
            chunk = qs[:, :, 32 * c:32 * c + 32].astype(np.int64)
            q[:, :, 64 * c:64 * c + 32] = chunk & 0xF
            q[:, :, 64 * c + 32:64 * c + 64] = chunk >> 4
            if qtype == T.Q5_K:
                qh = b[:, :, 16:48].astype(np.int64)
                q[:, :, 64 * c:64 * c + 32] += ((qh >> (2 * c)) & 1) << 4
                q[:, :, 64 * c + 32:64 * c + 64] += ((qh >> (2 * c + 1)) & 1) << 4
        scx = np.repeat(sc, 32, axis=2)
        ws = scx * q
        absw = (np.abs(xd[..., None].astype(np.float64) * scx * q)
                + np.abs(xm[..., None].astype(np.float64) * np.repeat(mn, 32, axis=2)))
        return ws, xd, xm, mn, absw.reshape(rows, k)
    if qtype == T.Q6_K:
        xd = _f16le(b[:, :, 208:210])
        sc = b[:, :, 192:208].view(np.int8).astype(np.int64)
        q = np.empty((rows, nb, 256), np.int64)
        for half in range(2):
            ql = b[:, :, 64 * half:64 * half + 64].astype(np.int64)
            qh = b[:, :, 128 + 32 * half:160 + 32 * half].astype(np.int64)
            o = 128 * half
            q[:, :, o:o + 32] = ((ql[..., :32] & 0xF) | (((qh >> 0) & 3) << 4)) - 32
            q[:, :, o + 32:o + 64] = ((ql[..., 32:] & 0xF) | (((qh >> 2) & 3) << 4)) - 32
            q[:, :, o + 64:o + 96] = ((ql[..., :32] >> 4) | (((qh >> 4) & 3) << 4)) - 32
            q[:, :, o + 96:o + 128] = ((ql[..., 32:] >> 4) | (((qh >> 6) & 3) << 4)) - 32
        scx = np.repeat(sc, 16, axis=2)
        ws = scx * q
        absw = np.abs(xd[..., None].astype(np.float64) * ws)
        return ws, xd, None, None, absw.reshape(rows, k)
    raise AssertionError(qtype)


def emulate_c_matmul(w, qtype, x):
    """float32 result of the generic C vec_dot for every (activation row, weight row)."""
    x = np.asarray(x, np.float32)
    n, k = x.shape
    rows = w.shape[0]
    if qtype == T.F32:
        # scalar ggml_vec_dot_f32: float32 products summed in double, then float
        s = np.zeros((n, rows), np.float64)
        for i in range(k):
            s = s + (x[:, i:i + 1] * w[None, :, i]).astype(np.float64)
        return s.astype(np.float32)
    if qtype == T.Q8_0:
        yd, yq = K.quantize_q8_0(x)
        nb = k // 32
        b = w.reshape(rows, nb, 34)
        xd = _f16le(b[:, :, 0:2])
        wq = b[:, :, 2:].view(np.int8).astype(np.int64)
        sumi = np.einsum("rbl,nbl->nrb", wq, yq.reshape(n, nb, 32).astype(np.int64))
        s = np.zeros((n, rows), np.float32)
        for i in range(nb):
            s = s + sumi[:, :, i].astype(np.float32) * (xd[None, :, i] * yd[:, i:i + 1])
        return s
    yd, yq, ybs = K.quantize_q8_K(x)
    nb = k // 256
    ws, xd, xm, mn, _ = _unpack_k(w, qtype, k)
    sums = np.zeros((n, rows, 8), np.float32)
    sumf = np.zeros((n, rows), np.float32)
    for i in range(nb):
        aux = np.einsum("rgl,ngl->nrl", ws[:, i].reshape(rows, 32, 8),
                        yq[:, 256 * i:256 * i + 256].reshape(n, 32, 8).astype(np.int64))
        assert np.abs(aux).max() < 2 ** 24  # int32 -> float exact, as in C
        d = xd[None, :, i] * yd[:, i:i + 1]
        sums = sums + d[..., None] * aux.astype(np.float32)
        if mn is not None:
            sumi = np.einsum("rm,nm->nr", np.repeat(mn[:, i], 2, axis=1),
                             ybs[:, 16 * i:16 * i + 16].astype(np.int64))
            dmin = xm[None, :, i] * yd[:, i:i + 1]
            sumf = sumf - dmin * sumi.astype(np.float32)
    for l in range(8):
        sumf = sumf + sums[..., l]
    return sumf


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


# ----------------------------------------------------------------- dequantization

@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("finite_any", [False, True])
def test_dequantize_rows_matches_gguf(qtype, finite_any):
    rng = np.random.default_rng(100 + int(qtype) + 7 * finite_any)
    w = rand_weights(rng, qtype, 37, 512, finite_any=finite_any)
    got = K.dequantize_rows(w, qtype)
    exp = gq.dequantize(w, qtype)
    assert got.dtype == np.float32 and got.shape == (37, 512)
    assert np.array_equal(_bits(got), _bits(exp))


# ----------------------------------------------------------------- Q8_K

def _q8K_numpy(x):
    """Independent NumPy transcription of quantize_row_q8_K_ref."""
    n, k = x.shape
    xb = x.reshape(n, k // 256, 256)
    idx = np.argmax(np.abs(xb), axis=-1)  # first index of the largest |x| (C: strict >)
    mx = np.take_along_axis(xb, idx[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.float32(-127.0) / mx
        q = np.nan_to_num(np.minimum(127, np.rint(iscale[..., None] * xb))).astype(np.int8)
    zero = mx == 0
    q[zero] = 0
    d = np.where(zero, np.float32(0), np.float32(1.0) / iscale).astype(np.float32)
    bs = q.reshape(n, k // 16, 16).astype(np.int32).sum(-1).astype(np.int16)
    return d, q.reshape(n, k), bs


def test_quantize_q8_K_exact_and_half_step():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((9, 1024)) * rng.uniform(0.01, 100, (9, 1))).astype(np.float32)
    x[3, 256:512] = 0.0                      # zero block
    x[4, :256] = rng.uniform(-1, 1, 256)
    x[4, 17] = -5.0                          # negative max
    x[5, :256] = 0.25                        # ties for rint: iscale*x = -127 exactly etc.
    x[5, 7] = -0.25                          # |x| tie: first (positive) one wins
    x[6, :256] = np.arange(256, dtype=np.float32) - 127.0  # exact .0 values, amax=128
    d, qs, bs = K.quantize_q8_K(x)
    assert d.dtype == np.float32 and qs.dtype == np.int8 and bs.dtype == np.int16
    assert d.shape == (9, 4) and qs.shape == (9, 1024) and bs.shape == (9, 64)
    dn, qn, bn = _q8K_numpy(x)
    assert np.array_equal(_bits(d), _bits(dn))
    assert np.array_equal(qs, qn)
    assert np.array_equal(bs, bn)
    # zero block
    assert d[3, 1] == 0 and not qs[3, 256:512].any() and not bs[3, 16:32].any()
    # negative max -> positive d, that element is -127
    assert d[4, 0] > 0 and qs[4, 17] == -127
    # tie in |x|: first is +0.25 -> d < 0
    assert d[5, 0] < 0 and qs[5, 0] == -127 and qs[5, 7] == 127
    # bsums are sums of 16 quants
    assert np.array_equal(bs, qs.reshape(9, 64, 16).astype(np.int32).sum(-1))
    # reconstruction error <= half a step (plus float32 rounding of d and iscale*x)
    rec = np.repeat(d.astype(np.float64), 256, axis=1) * qs
    step = np.repeat(np.abs(d.astype(np.float64)), 256, axis=1)
    assert np.all(np.abs(rec - x) <= 0.5 * step * (1 + 1e-5) + 1e-30)


def test_quantize_q8_0_matches_gguf():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((7, 512)) * rng.uniform(1e-3, 50, (7, 1))).astype(np.float32)
    x[1, 32:64] = 0.0
    # exact halves after scaling: amax = 127 -> d = 1, id = 1 (roundf: away from zero)
    x[2, :32] = np.array([127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5] * 4, np.float32)
    d, qs = K.quantize_q8_0(x)
    assert d.dtype == np.float32 and qs.dtype == np.int8 and d.shape == (7, 16)
    nb = 512 // 32
    mine = np.concatenate([d.astype(np.float16).reshape(7, nb, 1).view(np.uint8),
                           qs.reshape(7, nb, 32).view(np.uint8)], axis=2).reshape(7, nb * 34)
    ref = gq.quantize(x, T.Q8_0)
    assert np.array_equal(mine, ref)
    assert list(qs[2, :8]) == [127, 1, 2, 3, -1, -2, -3, 4]
    # d is exactly representable in f16
    assert np.array_equal(d, d.astype(np.float16).astype(np.float32))


# ----------------------------------------------------------------- matmul

def _activations(rng, n, k):
    x = rng.standard_normal((n, k)).astype(np.float32)
    x *= rng.uniform(0.1, 10, (n, 1)).astype(np.float32)
    x[n // 2, : min(k, 256)] = 0.0  # a zero activation block
    return x


@pytest.mark.parametrize("qtype", ALL_MM)
@pytest.mark.parametrize("n", [1, 5])
def test_matmul_bit_exact_vs_c_order_emulation(qtype, n, kernel_path):
    rng = np.random.default_rng(10 * int(qtype) + n)
    k = 768
    w = rand_weights(rng, qtype, 45, k)
    x = _activations(rng, n, k)
    got = K.matmul(w, qtype, x)
    assert got.dtype == np.float32 and got.shape == (n, 45)
    exp = emulate_c_matmul(w, qtype, x)
    assert np.array_equal(_bits(got), _bits(exp))


@pytest.mark.parametrize("qtype", ALL_MM)
def test_extreme_quants_do_not_saturate(qtype, kernel_path):
    """Every quant at its largest or smallest value against activations at +-127: the sums a
    SIMD path forms in 16 bits (vpmaddubsw saturates) must still be the C's exact integers."""
    k, rows = 512, 16
    w = rand_weights(np.random.default_rng(70), qtype, rows, k)
    if qtype != T.F32:
        bs, ts = BPB[qtype]
        blocks = w.reshape(rows, k // bs, ts)
        keep = {T.Q8_0: slice(0, 2), T.Q4_K: slice(0, 4), T.Q5_K: slice(0, 4), T.Q6_K: slice(208, 210)}[qtype]
        for r in range(rows):   # quants (and 6-bit scales) all ones, or all zeros, per row
            f16 = blocks[r, :, keep].copy()
            blocks[r] = 0xFF if r % 2 else 0x00
            blocks[r, :, keep] = f16
        if qtype == T.Q8_0:
            blocks[2::4, :, 2:] = 0x80   # int8 -128
            blocks[3::4, :, 2:] = 0x7F
    signs = np.array([[1], [-1]], np.float32)
    x = np.concatenate([np.ones((2, k), np.float32) * signs,
                        np.where(np.arange(k) % 2, 1.0, -1.0).astype(np.float32)[None]])
    got = K.matmul(w, qtype, x)
    assert np.array_equal(_bits(got), _bits(emulate_c_matmul(w, qtype, x)))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K])
@pytest.mark.parametrize("n", [1, 3])
def test_kernel_paths_agree_on_inf_and_nan_scales(qtype, n):
    """Super-blocks whose f16 scale or min is +-inf or a NaN: every path gives the same bits
    wherever the result is a number, and a NaN in the same places (which NaN -- its sign --
    follows the operand order the compiler picks, in ggml's C as here)."""
    paths = K.available_paths()
    if len(paths) < 2:
        pytest.skip("this CPU runs only the portable kernels")
    rng = np.random.default_rng(80 + n)
    w = rand_weights(rng, qtype, 32, 512)
    blocks = w.reshape(32, 2, BPB[qtype][1])
    d_at = 208 if qtype == T.Q6_K else 0
    specials = np.array([0x7C00, 0xFC00, 0x7E01, 0xFE00, 0x7D55], np.uint16)   # inf, -inf, NaNs
    for r in range(0, 32, 3):
        blocks[r, r % 2, d_at:d_at + 2] = specials[r % 5:r % 5 + 1].view(np.uint8)
        if qtype != T.Q6_K and r % 2:
            blocks[r, 0, 2:4] = specials[(r + 1) % 5:(r + 1) % 5 + 1].view(np.uint8)   # dmin
    x = _activations(rng, n, 512)
    old = K.kernel_path()
    try:
        got = []
        for p in paths:
            K.set_kernel_path(p)
            got.append(K.matmul(w, qtype, x))
    finally:
        K.set_kernel_path(old)
    want = got[0]
    assert np.isnan(want).any() and not np.isnan(want).all()
    for g in got[1:]:
        assert np.array_equal(np.isnan(g), np.isnan(want))
        assert np.array_equal(_bits(g[~np.isnan(g)]), _bits(want[~np.isnan(want)]))


def test_q8_0_activation_quants_never_reach_minus_128():
    """The AVX2 Q8_0 product negates activation quants by the weights' signs; that is exact
    only because quantize_q8_0 keeps them within +-127 (x * 127 / amax rounds to at most
    127), whatever the rows -- ties, one huge value, denormals, all equal."""
    rng = np.random.default_rng(90)
    x = np.concatenate([rng.standard_normal((64, 256)).astype(np.float32) * rng.uniform(1e-3, 1e5, (64, 1)).astype(np.float32),
                        np.full((2, 256), -3.0, np.float32), np.full((2, 256), 1e-40, np.float32),
                        np.tile(np.float32([-1.0, 1.0]), (2, 128))]).astype(np.float32)
    _, qs = K.quantize_q8_0(x)
    assert qs.min() == -127 and qs.max() == 127


def _deq_activation(qtype, x):
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        d, qs, _ = K.quantize_q8_K(x)
        return np.repeat(d.astype(np.float64), 256, axis=1) * qs
    if qtype == T.Q8_0:
        d, qs = K.quantize_q8_0(x)
        return np.repeat(d.astype(np.float64), 32, axis=1) * qs
    return x.astype(np.float64)


@pytest.mark.parametrize("qtype", ALL_MM)
def test_matmul_accuracy_vs_float64(qtype):
    rng = np.random.default_rng(20 + int(qtype))
    k, rows, n = 512, 64, 4
    w = rand_weights(rng, qtype, rows, k)
    x = _activations(rng, n, k)
    got = K.matmul(w, qtype, x).astype(np.float64)
    wd = K.dequantize_rows(w, qtype).astype(np.float64)
    xd = _deq_activation(qtype, x)
    exp = xd @ wd.T
    # Error model: all integer sums are exact; the float part is a few float32 roundings
    # per output (per super-block: d = dx*dy, d*aux, += ; the min term; 8 final lane adds;
    # for F32: one float32 rounding per product, then a double sum rounded once).
    # Every rounded quantity is bounded by S = sum_i |w_i|*|x_i| (|w| split as
    # |d*sc*q| + |dmin*m| for the K-quants, since the min term is accumulated separately),
    # so |err| <= c * eps32 * S with c ~ the length of the longest float32 chain
    # (nb + 10 <= 12 here; ~2 for F32).  eps32 = 6e-8, so 1e-5 * S (c ~ 170) is a
    # safe bound, while a wrong scale/offset/bit would give errors of order S.
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        absw = _unpack_k(w, qtype, k)[4]
    else:
        absw = np.abs(wd)
    S = np.abs(xd) @ absw.T
    tol = 1e-5 * S + 1e-30
    err = np.abs(got - exp)
    assert np.all(err <= tol), float((err / tol).max())
    # and the result is not trivially zero
    assert np.abs(got).max() > 0


@pytest.mark.parametrize("qtype", ALL_MM)
def test_thread_count_determinism(qtype, kernel_path):
    rng = np.random.default_rng(30 + int(qtype))
    k, rows, n = 512, 100, 7  # rows not a multiple of the chunk size
    w = rand_weights(rng, qtype, rows, k)
    x = _activations(rng, n, k)
    old = K.get_threads()
    try:
        K.set_threads(1)
        a = K.matmul(w, qtype, x)
        K.set_threads(min(2, K.numba.config.NUMBA_NUM_THREADS))
        b = K.matmul(w, qtype, x)
    finally:
        K.set_threads(old)
    assert np.array_equal(_bits(a), _bits(b))
    # row independence: one activation row alone gives the same bits as inside a batch
    c = K.matmul(w, qtype, x[3:4])
    assert np.array_equal(_bits(c[0]), _bits(a[3]))


def test_activation_quantized_once_serves_every_matrix_and_row_subset():
    """The forward quantizes a layer's input once for q/k/v, and an MoE input once for all
    experts, each expert taking its subset of the rows: the same bits as multiplying those
    rows alone."""
    rng = np.random.default_rng(40)
    x = _activations(rng, 6, 512)
    a = K.Activation(x)
    rows_of = [np.array([4, 1, 1, 5]), np.array([], dtype=np.int64), np.array([0, 2, 3]), np.array([5])]
    for qtype in ALL_MM:
        ws = [rand_weights(rng, qtype, 24, 512) for _ in rows_of]
        assert np.array_equal(_bits(K.matmul(ws[0], qtype, a)), _bits(K.matmul(ws[0], qtype, x)))
        got = K.matmul_rows(ws, qtype, a, rows_of)
        want = np.concatenate([K.matmul(w, qtype, x[r]) if len(r) else np.zeros((0, 24), np.float32)
                               for w, r in zip(ws, rows_of)])
        assert got.shape == (8, 24) and np.array_equal(_bits(got), _bits(want))


# ----------------------------------------------------------------- pinned to the previous kernels

@pytest.mark.parametrize("qtype", ALL_MM)
@pytest.mark.parametrize("finite_any", [False, True])
def test_kernels_are_bit_identical_to_the_pinned_kernels(qtype, finite_any, kernel_path):
    """The kernels rewritten for speed, on every kernel path, give the bits of the kernels
    before the rewrite (tests/pinned_kernels.py) on random weights of every type -- any
    finite f16 scale too -- and odd shapes: row counts around the 16-row work items, one to
    13 activation rows, 1 to 9 blocks, at 1 and 2 threads."""
    import pinned_kernels as OLD
    rng = np.random.default_rng(60 + int(qtype) + 100 * finite_any)
    bs = 1 if qtype == T.F32 else BPB[qtype][0]
    old_threads = K.get_threads()
    try:
        for rows, blocks, n in ((1, 1, 1), (7, 3, 2), (17, 2, 13), (33, 9, 1), (16, 1, 5), (48, 4, 3)):
            k = blocks * max(bs, 32)
            w = rand_weights(rng, qtype, rows, k, finite_any=finite_any)
            x = _activations(rng, n, k)
            want = OLD.matmul(w, qtype, OLD.Activation(x))
            for t in (1, min(2, K.numba.config.NUMBA_NUM_THREADS)):
                K.set_threads(t)
                got = K.matmul(w, qtype, x)
                assert np.array_equal(_bits(got), _bits(want)), (rows, k, n, t)
    finally:
        K.set_threads(old_threads)


def test_bad_shapes_and_types_are_value_errors():
    rng = np.random.default_rng(41)
    w = rand_weights(rng, T.Q4_K, 16, 512)
    x = _activations(rng, 3, 512)
    with pytest.raises(ValueError, match="shape"):
        K.matmul(w, T.Q4_K, x[:, :256])          # k mismatch
    with pytest.raises(ValueError, match="2-D"):
        K.matmul(w, T.Q4_K, x[0])
    with pytest.raises(ValueError, match="unsupported ggml type 10"):
        K.matmul(w, T.Q2_K, x)
    with pytest.raises(ValueError, match="unsupported ggml type 11"):
        K.dequantize_rows(w, T.Q3_K)
    with pytest.raises(ValueError, match="Q6_K rows"):
        K.dequantize_rows(w, T.Q6_K)             # 288 bytes per row is not whole Q6_K blocks


# ----------------------------------------------------------------- vs the reference engine

@pytest.mark.parametrize("qtype", ALL_MM)
def test_matches_reference_bit_for_bit(qtype, kernel_path):
    from epmci.reference import quants as R
    rng = np.random.default_rng(50 + int(qtype))
    k = 768
    w = rand_weights(rng, qtype, 40, k)
    x = _activations(rng, 6, k)
    # the reference takes every weight type as raw row bytes (rows, row_bytes)
    ref = np.asarray(R.matmul(np.ascontiguousarray(w).view(np.uint8), int(qtype), x))
    got = K.matmul(w, qtype, x)
    assert ref.shape == got.shape
    assert np.array_equal(_bits(got), _bits(ref.astype(np.float32)))


def test_f32_products_agree_on_every_path_at_odd_shapes():
    """The x86 F32 product takes 8 rows as vector lanes and 8 columns at a time: row counts
    that leave 1-7 rows over and lengths that leave 1-7 columns over give the portable
    kernel's bits too."""
    rng = np.random.default_rng(77)
    old = K.kernel_path()
    try:
        for rows, k, n in ((1, 1, 1), (5, 13, 3), (17, 9, 2), (23, 40, 1), (16, 8, 4)):
            w = rng.standard_normal((rows, k)).astype(np.float32)
            x = rng.standard_normal((n, k)).astype(np.float32)
            K.set_kernel_path("portable")
            want = K.matmul(w, T.F32, x)
            for path in K.available_paths()[1:]:
                K.set_kernel_path(path)
                assert np.array_equal(_bits(K.matmul(w, T.F32, x)), _bits(want)), (rows, k, n, path)
    finally:
        K.set_kernel_path(old)
