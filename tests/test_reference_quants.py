"""Tests of epmci.reference.quants against gguf-py and against literal Python
transliterations of ggml's scalar C code (ggml-quants.c, ggml-cpu/quants.c)."""

from __future__ import annotations

import importlib.metadata
import struct

import numpy as np
import pytest
import gguf.quants as gq
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from epmci.reference import quants as rq

F32 = np.float32
KTYPES = [QT.Q4_K, QT.Q5_K, QT.Q6_K]
WTYPES = KTYPES + [QT.Q8_0]

# byte offsets of the f16 fields of each block type (ggml-common.h)
F16_FIELDS = {QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,), QT.Q8_0: (0,)}


# ------------------------------------------------------------------------------ helpers

def finite_halfs(rng, n, full_range=True):
    """n finite f16 bit patterns (as uint16).  full_range: any finite half incl. subnormals,
    zeros and negatives; else |d| in [2^-14, 1) with random sign (normal, well scaled)."""
    if full_range:
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
        bad = (bits & 0x7C00) == 0x7C00                         # inf / NaN exponent
        bits[bad] &= 0x3FFF                                     # clear the top exponent bit
        bits[:4] = [0x0000, 0x8000, 0x0001, 0x7BFF][: min(4, n)]  # +0, -0, min subnormal, max
        return bits
    mag = np.exp2(rng.uniform(-14, 0, n)).astype(np.float16)
    sign = rng.choice([-1, 1], n).astype(np.float16)
    return (mag * sign).view(np.uint16)


def random_blocks(rng, qtype, shape_blocks, full_range=True):
    """Random valid bytes: (*shape_blocks, type_size) uint8 with finite f16 fields."""
    _, ts = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (*shape_blocks, ts), dtype=np.uint16).astype(np.uint8)
    flat = b.reshape(-1, ts)
    for off in F16_FIELDS.get(qtype, ()):
        h = finite_halfs(rng, flat.shape[0], full_range)
        flat[:, off:off + 2] = h.view(np.uint8).reshape(-1, 2)
    return b


def random_rows(rng, qtype, rows, k, full_range=True):
    bs, _ = GGML_QUANT_SIZES[qtype]
    b = random_blocks(rng, qtype, (rows, k // bs), full_range)
    return b.reshape(rows, -1)


def bits32(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def f16(buf, off):
    return np.frombuffer(bytes(buf[off:off + 2]), "<f2")[0].astype(F32)


# --------------------------------------------------- literal transliterations of the C

def c_quantize_row_q8_K_ref(x):
    """quantize_row_q8_K_ref, one statement at a time."""
    x = [F32(v) for v in x]
    ds, qs, bsums = [], [], []
    for i in range(len(x) // 256):
        xb = x[256 * i: 256 * (i + 1)]
        vmax, amax = F32(0), F32(0)
        for v in xb:
            if abs(v) > amax:
                amax, vmax = abs(v), v
        if not amax:
            ds.append(F32(0)); qs += [0] * 256; bsums += [0] * 16
            continue
        iscale = F32(-127.0) / vmax
        q = []
        for v in xb:
            val = np.array([F32(iscale * v) + F32(12582912.0)], F32).view(np.int32)[0]
            q.append(min(127, int((val & 0x007FFFFF) - 0x00400000)))
        qs += q
        bsums += [sum(q[16 * j:16 * j + 16]) for j in range(16)]
        ds.append(F32(1.0) / iscale)
    return np.array(ds, F32), np.array(qs, np.int8), np.array(bsums, np.int16)


def _scales_mins_utmp(sc12):
    """The kmask/utmp unpacking of ggml_vec_dot_q4_K_q8_K_generic (little-endian)."""
    kmask1, kmask2, kmask3 = 0x3F3F3F3F, 0x0F0F0F0F, 0x03030303
    u = list(struct.unpack("<3I", bytes(sc12))) + [0]
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4)
    uaux = u[1] & kmask1
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4)
    u[2] = uaux
    u[0] &= kmask1
    raw = struct.pack("<4I", *u)
    return list(raw[0:8]), list(raw[8:16])


def c_vec_dot(w_row, qtype, a):
    """ggml_vec_dot_{q4_K,q5_K,q6_K}_q8_K_generic / ggml_vec_dot_q8_0_q8_0_generic."""
    w = bytes(np.asarray(w_row, np.uint8))
    if qtype == QT.Q8_0:
        sumf = F32(0)
        for ib in range(len(w) // 34):
            blk = w[34 * ib: 34 * ib + 34]
            xq = np.frombuffer(blk[2:], np.int8)
            sumi = sum(int(xq[j]) * int(a.qs[32 * ib + j]) for j in range(32))
            sumf = F32(sumf + F32(F32(sumi) * F32(f16(blk, 0) * F32(a.d[ib]))))
        return sumf
    ts = GGML_QUANT_SIZES[qtype][1]
    sums = [F32(0)] * 8
    sumf = F32(0)
    for i in range(len(w) // ts):
        blk = w[ts * i: ts * (i + 1)]
        q8 = [int(v) for v in a.qs[256 * i: 256 * (i + 1)]]
        yd = F32(a.d[i])
        aux = []
        if qtype in (QT.Q4_K, QT.Q5_K):
            q4 = blk[16:144] if qtype == QT.Q4_K else blk[48:176]
            hm = blk[16:48]
            m = 1
            for j in range(4):
                lo = [q4[32 * j + l] & 0xF for l in range(32)]
                hi = [q4[32 * j + l] >> 4 for l in range(32)]
                if qtype == QT.Q5_K:
                    lo = [lo[l] + (16 if hm[l] & m else 0) for l in range(32)]; m <<= 1
                    hi = [hi[l] + (16 if hm[l] & m else 0) for l in range(32)]; m <<= 1
                aux += lo + hi
            scales, mins = _scales_mins_utmp(blk[4:16])
            sumi = sum(int(a.bsums[16 * i + j]) * mins[j // 2] for j in range(16))
            aux32 = [0] * 8
            idx = 0
            for j in range(8):
                for _ in range(4):
                    for l in range(8):
                        aux32[l] += scales[j] * (q8[idx + l] * aux[idx + l])
                    idx += 8
            d = F32(f16(blk, 0) * yd)
            sums = [F32(sums[l] + F32(d * F32(aux32[l]))) for l in range(8)]
            dmin = F32(f16(blk, 2) * yd)
            sumf = F32(sumf - F32(dmin * F32(sumi)))
        else:  # Q6_K
            ql, qh = blk[0:128], blk[128:192]
            sc = np.frombuffer(blk[192:208], np.int8)
            a8 = [0] * 256
            for h in range(2):
                q4, qhh = ql[64 * h:], qh[32 * h:]
                for l in range(32):
                    a8[128 * h + l + 0] = ((q4[l + 0] & 0xF) | (((qhh[l] >> 0) & 3) << 4)) - 32
                    a8[128 * h + l + 32] = ((q4[l + 32] & 0xF) | (((qhh[l] >> 2) & 3) << 4)) - 32
                    a8[128 * h + l + 64] = ((q4[l + 0] >> 4) | (((qhh[l] >> 4) & 3) << 4)) - 32
                    a8[128 * h + l + 96] = ((q4[l + 32] >> 4) | (((qhh[l] >> 6) & 3) << 4)) - 32
            aux32 = [0] * 8
            idx = 0
            for j in range(16):
                for _ in range(2):
                    for l in range(8):
                        aux32[l] += int(sc[j]) * (q8[idx + l] * a8[idx + l])
                    idx += 8
            d = F32(f16(blk, 208) * yd)
            sums = [F32(sums[l] + F32(d * F32(aux32[l]))) for l in range(8)]
    for l in range(8):
        sumf = F32(sumf + sums[l])
    return sumf


# ------------------------------------------------------------------------------ tests

def test_row_bytes():
    assert rq.row_bytes(QT.Q4_K, 512) == 288
    assert rq.row_bytes(QT.Q5_K, 256) == 176
    assert rq.row_bytes(QT.Q6_K, 768) == 630
    assert rq.row_bytes(QT.Q8_0, 64) == 68
    assert rq.row_bytes(QT.F16, 10) == 20
    assert rq.row_bytes(QT.F32, 10) == 40
    with pytest.raises(ValueError):
        rq.row_bytes(QT.Q4_K, 100)


@pytest.mark.parametrize("qtype", WTYPES + [QT.F16, QT.F32], ids=lambda t: t.name)
def test_dequantize_matches_gguf_bitwise(qtype):
    rng = np.random.default_rng(1000 + int(qtype))
    bs, ts = GGML_QUANT_SIZES[qtype]
    if qtype == QT.F16:
        raw = finite_halfs(rng, 2 * 3 * 512).view(np.uint8).reshape(2, 3, -1)
    elif qtype == QT.F32:
        raw = rng.standard_normal(2 * 3 * 512).astype(np.float32).view(np.uint8).reshape(2, 3, -1)
    else:
        nper = 512 // bs
        raw = random_blocks(rng, qtype, (2, 3, nper)).reshape(2, 3, nper * ts)
    ours = rq.dequantize(raw, qtype)                     # whole 3-D tensor at once
    theirs = gq.dequantize(raw, qtype)
    assert ours.dtype == np.float32 and ours.shape == (2, 3, 512) == theirs.shape
    assert np.array_equal(bits32(ours), bits32(theirs))
    # 2-D and 1-D (a single row) give the same values
    assert np.array_equal(bits32(rq.dequantize(raw.reshape(6, -1), qtype)), bits32(ours.reshape(6, -1)))
    assert np.array_equal(bits32(rq.dequantize(raw[1, 2], qtype)), bits32(ours[1, 2]))


def test_dequantize_rejects_other_types():
    with pytest.raises(ValueError):
        rq.dequantize(np.zeros((1, 18), np.uint8), QT.Q4_0)
    with pytest.raises(ValueError):
        rq.dequantize(np.zeros((1, 100), np.uint8), QT.Q4_K)   # not whole blocks


def _q8k_test_input(rng):
    x = rng.standard_normal((3, 1024)).astype(np.float32) * np.float32(3.0)
    x[0, 256:512] = 0                                   # an all-zero block
    x[1, :256] = np.abs(x[1, :256]); x[1, 17] = -50.0   # block whose max is negative
    x[1, 256:512] *= np.float32(1e-3)                   # small scale
    x[2, 512:768] = np.abs(x[2, 512:768]); x[2, 600] = 50.0
    x[2, 768:] = 0; x[2, 800], x[2, 900] = -7.0, 7.0    # |max| tie: the first (negative) wins
    return x


def test_quantize_q8_K_properties():
    x = _q8k_test_input(np.random.default_rng(7))
    a = rq.quantize_q8_K(x)
    assert a.d.dtype == np.float32 and a.d.shape == (3, 4)
    assert a.qs.dtype == np.int8 and a.qs.shape == (3, 1024)
    assert a.bsums.dtype == np.int16 and a.bsums.shape == (3, 64)
    # bsums = sums of the qs in groups of 16
    assert np.array_equal(a.bsums, a.qs.reshape(3, 64, 16).astype(np.int32).sum(-1))
    # all-zero block: d = 0, qs = 0
    assert a.d[0, 1] == 0 and not a.qs[0, 256:512].any()
    # d = 1/iscale = -max/127: the max maps to -127, so d has the opposite sign of max
    assert a.d[1, 0] > 0 and a.qs[1, 17] == -127
    assert a.d[2, 2] < 0 and a.qs[2, 600] == -127
    assert a.d[2, 3] > 0 and a.qs[2, 800] == -127 and a.qs[2, 900] == 127
    # round trip within half a step (float32 slack: iscale and d=1/iscale are rounded)
    err = np.abs(a.dequantize().astype(np.float64) - x)
    step = np.repeat(np.abs(a.d).astype(np.float64), 256, axis=-1)
    assert np.all(err <= step * (0.5 + 1e-5) + 1e-30)
    assert np.all(np.abs(a.qs.astype(np.int32)) <= 127)


def test_quantize_q8_K_matches_c_transliteration():
    x = _q8k_test_input(np.random.default_rng(8))
    a = rq.quantize_q8_K(x)
    for r in range(x.shape[0]):
        d, qs, bsums = c_quantize_row_q8_K_ref(x[r])
        assert np.array_equal(bits32(a.d[r]), bits32(d))
        assert np.array_equal(a.qs[r], qs)
        assert np.array_equal(a.bsums[r], bsums)


def test_quantize_q8_K_vs_gguf():
    x = _q8k_test_input(np.random.default_rng(9))
    try:
        ref = gq.quantize(x, QT.Q8_K)
    except (NotImplementedError, KeyError) as e:
        pytest.skip(f"gguf-py {importlib.metadata.version('gguf')} cannot quantize Q8_K ({e})")
    a = rq.quantize_q8_K(x)
    ours = np.concatenate([a.d.reshape(3, 4, 1).view(np.uint8),
                           a.qs.reshape(3, 4, 256).view(np.uint8),
                           a.bsums.reshape(3, 4, 16).view(np.uint8)], axis=-1).reshape(3, -1)
    assert np.array_equal(ours, ref)


def test_quantize_q8_0_matches_gguf_bytes():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    x[0, :32] = 0                                        # zero block: d = 0, id = 0
    x[1, :32] = np.arange(32) - 15.5                     # exact .5 ties: roundf goes away from 0
    x[1, 31] = 127.0                                     # amax 127 -> d = 1, id = 1
    x[2] *= np.float32(1e-6)                             # d rounds to an f16 subnormal
    x[3] *= np.float32(1e4)
    a = rq.quantize_q8_0(x)
    assert a.d.dtype == np.float32 and a.d.shape == (4, 8) and a.qs.shape == (4, 256)
    ours = np.concatenate([a.d.astype(np.float16).reshape(4, 8, 1).view(np.uint8),
                           a.qs.reshape(4, 8, 32).view(np.uint8)], axis=-1).reshape(4, -1)
    ref = gq.quantize(x, QT.Q8_0)
    assert np.array_equal(ours, ref)
    assert a.qs[1, 0] == -16 and a.qs[1, 1] == -15 and a.qs[1, 16] == 1   # -15.5, -14.5, 0.5
    # the stored d is exactly f16-representable
    assert np.array_equal(a.d, a.d.astype(np.float16).astype(np.float32))


def _activation(rng, qtype, n, k):
    x = (rng.standard_normal((n, k)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
    return x, rq.quantize_activation(x, qtype)


@pytest.mark.parametrize("qtype", WTYPES, ids=lambda t: t.name)
def test_vec_dot_matches_c_transliteration_bitwise(qtype):
    rng = np.random.default_rng(20 + int(qtype))
    w = random_rows(rng, qtype, 3, 512, full_range=False)
    _, a = _activation(rng, qtype, 2, 512)
    y = rq.matmul(w, qtype, _)                            # (2, 3)
    for i in range(2):
        ai = type(a)(*(f[i] for f in a))
        for r in range(3):
            c = c_vec_dot(w[r], qtype, ai)
            v = rq.vec_dot(w[r], qtype, ai)
            assert isinstance(v, np.float32)
            assert bits32(v) == bits32(c), (i, r, v, c)
            assert bits32(y[i, r]) == bits32(c)


@pytest.mark.parametrize("qtype", WTYPES, ids=lambda t: t.name)
def test_vec_dot_equals_float_product_of_dequantized(qtype):
    """The integer-sum dot product equals the exact (float64) dot product of the two
    dequantized operands up to float32 rounding.  The C does a handful of float32 ops
    per block (<= 4 per super-block/lane plus 8 final adds; a row of 1024 has 4 super-
    blocks or 32 Q8_0 blocks), each rounding by <= 2^-24 relative to partial sums bounded
    by M = sum |parts of w| * |a|; the float32 dequantized w adds <= 2 ulp per element.
    So |err| <= ~40 * 6e-8 * M ~ 2.4e-6 M; we allow 1e-5 M.  For Q4_K/Q5_K, M counts the
    scale part d*sc*q and the min part dmin*m separately, since the C sums them apart
    and they can cancel in w."""
    rng = np.random.default_rng(40 + int(qtype))
    rows, k = 16, 1024
    w = random_rows(rng, qtype, rows, k, full_range=False)
    x, a = _activation(rng, qtype, 3, k)
    y = rq.matmul(w, qtype, x)
    wd = gq.dequantize(w, qtype).astype(np.float64)      # independent dequantization
    ad = a.dequantize().astype(np.float64)
    exact = ad @ wd.T
    if qtype in (QT.Q4_K, QT.Q5_K):
        ws = w.reshape(rows, -1, GGML_QUANT_SIZES[qtype][1]).copy()
        w_scale, w_min = ws.copy(), ws.copy()
        w_scale[..., 2:4] = 0                             # dmin = 0 -> d*sc*q
        w_min[..., 0:2] = 0                               # d = 0    -> -dmin*m
        mag_w = (np.abs(gq.dequantize(w_scale.reshape(rows, -1), qtype).astype(np.float64))
                 + np.abs(gq.dequantize(w_min.reshape(rows, -1), qtype).astype(np.float64)))
    else:
        mag_w = np.abs(wd)
    mag = np.abs(ad) @ mag_w.T
    assert np.all(np.abs(y.astype(np.float64) - exact) <= 1e-5 * mag + 1e-30)
    # and the test is not vacuous: the results are far from zero relative to the bound
    assert np.median(np.abs(exact) / mag) > 1e-3


@pytest.mark.parametrize("qtype", WTYPES + [QT.F32, QT.F16], ids=lambda t: t.name)
def test_matmul_shape_and_consistency(qtype):
    rng = np.random.default_rng(60 + int(qtype))
    rows, k, n = 5, 512, 3
    if qtype in (QT.F32, QT.F16):
        wf = rng.standard_normal((rows, k)).astype(np.float32 if qtype == QT.F32 else np.float16)
        w = wf.view(np.uint8)
    else:
        w = random_rows(rng, qtype, rows, k, full_range=False)
    x = rng.standard_normal((n, k)).astype(np.float32)
    y = rq.matmul(w, qtype, x)
    assert y.shape == (n, rows) and y.dtype == np.float32
    a = rq.quantize_activation(x, qtype)
    for i in range(n):
        ai = type(a)(*(f[i] for f in a)) if isinstance(a, tuple) else a[i]
        mv = rq.matvec(w, qtype, ai)
        assert mv.shape == (rows,) and mv.dtype == np.float32
        assert np.array_equal(bits32(mv), bits32(y[i]))
        for r in range(rows):
            assert bits32(rq.vec_dot(w[r], qtype, ai)) == bits32(y[i, r])
    # deterministic: a second call is bit-identical
    assert np.array_equal(bits32(rq.matmul(w, qtype, x)), bits32(y))


def test_matmul_float_weights_scalar_order():
    """F32/F16 weights: float32 products summed in double in element order (ggml scalar)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((2, 64)).astype(np.float32)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    y = rq.matmul(w.view(np.uint8), QT.F32, x)
    for r in range(2):
        acc = 0.0
        for j in range(64):
            acc += float(F32(w[r, j] * x[0, j]))
        assert y[0, r] == F32(acc)
    w16 = w.astype(np.float16)
    y16 = rq.matmul(w16.view(np.uint8), QT.F16, x)
    x16 = x.astype(np.float16).astype(np.float32)
    acc = sum(float(F32(F32(w16[0, j]) * x16[0, j])) for j in range(64))  # exact products
    assert y16[0, 0] == F32(acc)


def test_matmul_hand_computed():
    """Cases whose exact answer is a small integer, computed without the module."""
    # activation: integers with |x| <= 127 and x[0] = -127, so max = -127, iscale = 1,
    # d = 1 and q8 = x exactly (also for Q8_0: amax 127 -> d = 1, id = 1, qs = x)
    x = ((np.arange(512) * 37) % 255 - 127).astype(np.float32)
    x[::32] = -127                                        # in every Q8_0 and Q8_K block
    a8k = rq.quantize_q8_K(x)
    assert np.array_equal(a8k.d, [1, 1]) and np.array_equal(a8k.qs, x.astype(np.int8))
    xi = x.astype(np.int64)

    # Q4_K: d = 1, dmin = 0.5, every sub-block sc = 1, m = 2 -> w = q - 1
    q = (np.arange(512) * 7) % 16
    blocks = []
    for i in range(2):
        qb = q[256 * i: 256 * (i + 1)].reshape(4, 2, 32)
        qs = (qb[:, 0] | (qb[:, 1] << 4)).astype(np.uint8).reshape(-1)
        scales = np.array([1] * 4 + [2] * 4 + [0x21] * 4, np.uint8)
        hdr = np.array([1.0, 0.5], np.float16).view(np.uint8)
        blocks.append(np.concatenate([hdr, scales, qs]))
    w = np.concatenate(blocks)[None]
    assert np.array_equal(rq.dequantize(w, QT.Q4_K)[0], q - 1.0)
    assert rq.matmul(w, QT.Q4_K, x[None])[0, 0] == float(((q - 1) * xi).sum())

    # Q8_0: d = 0.25, qs = pattern
    qs = ((np.arange(512) * 11) % 200 - 100).astype(np.int8).reshape(16, 32)
    d = np.full((16, 1), 0.25, np.float16).view(np.uint8)
    w = np.concatenate([d, qs.view(np.uint8)], axis=1).reshape(1, -1)
    a80 = rq.quantize_q8_0(x)
    assert np.array_equal(a80.d, np.ones(16)) and np.array_equal(a80.qs, x.astype(np.int8))
    assert rq.matmul(w, QT.Q8_0, x[None])[0, 0] == 0.25 * float((qs.reshape(-1) * xi).sum())

    # Q6_K: d = 1, all 16 scales = 1, all q = 33 -> w = 1
    blk = np.zeros(210, np.uint8)
    blk[0:128] = 0x11                                     # low nibbles 1
    blk[128:192] = 0b10101010                             # high 2 bits = 2 -> q = 33
    blk[192:208] = 1
    blk[208:210] = np.array([1.0], np.float16).view(np.uint8)
    w = np.concatenate([blk, blk])[None]
    assert np.array_equal(rq.dequantize(w, QT.Q6_K)[0], np.ones(512, np.float32))
    assert rq.matmul(w, QT.Q6_K, x[None])[0, 0] == float(xi.sum())


def test_matmul_rejects_bad_input():
    w = np.zeros((2, 144), np.uint8)
    with pytest.raises(ValueError):
        rq.matmul(w, QT.Q4_K, np.zeros((1, 512), np.float32))   # length mismatch
    with pytest.raises(ValueError):
        rq.matmul(np.zeros((2, 18), np.uint8), QT.Q4_0, np.zeros((1, 32), np.float32))
    with pytest.raises(TypeError):
        rq.matvec(w, QT.Q4_K, rq.quantize_q8_0(np.zeros(256, np.float32)))


@pytest.mark.parametrize("qtype", WTYPES + [QT.F32], ids=lambda t: t.name)
def test_matmul_in_row_slices_gives_the_same_bits(qtype, monkeypatch):
    """A large weight (the 248k-row output head) is multiplied in slices of rows to bound
    memory; the slicing must not change a bit."""
    rng = np.random.default_rng(70 + int(qtype))
    rows, k, n = 37, 512, 4
    if qtype == QT.F32:
        w = rng.standard_normal((rows, k)).astype(np.float32).view(np.uint8)
    else:
        w = random_rows(rng, qtype, rows, k, full_range=False)
    x = rng.standard_normal((n, k)).astype(np.float32)
    whole = rq.matmul(w, qtype, x)
    monkeypatch.setattr(rq, "_DOT_CHUNK_BYTES", 1)   # one row per slice
    assert np.array_equal(bits32(rq.matmul(w, qtype, x)), bits32(whole))
