"""The engine's kernels as of commit 3a13bc1 (before the decode-speed rewrite), frozen here
so tests/test_engine_kernels.py can pin the current kernels to them bit for bit. Not used
by the engine. What follows is that commit's module docstring.

Numba kernels of the engine: activation quantization, quantized mat-vec/mat-mat
products and row dequantization, following ggml's CPU numerics.

Numerics (read against llama.cpp's C sources, not memory):

* ``quantize_q8_K``  == ``quantize_row_q8_K_ref`` (ggml/src/ggml-quants.c): signed max by
  |x| (first strictly larger |x| wins), ``iscale = -127.f/max`` in float32,
  ``nearest_int`` (the ``+12582912.f`` magic, i.e. round half to even), ``MIN(127, v)``,
  ``d = 1/iscale``, bsums = sums of 16 quants.  An all-zero block gives d = 0, qs = 0
  (and bsums = 0; the C leaves bsums unwritten there, which cannot change a product
  because d = 0).
* ``quantize_q8_0``  == ``quantize_row_q8_0_ref``: ``d = amax/127``, ``id = d ? 1/d : 0``,
  ``qs = roundf(x*id)`` (half away from zero) using the *unrounded* d, then d is stored
  as f16.  The returned d is the float32 value of that f16.
* ``matmul_kquant`` (Q4_K/Q5_K/Q6_K) == ``ggml_vec_dot_q{4,5,6}_K_q8_K_generic``
  (ggml/src/ggml-cpu/quants.c) per output element: exact int32 lane sums
  ``aux32[l]`` (lane l = position mod 8) per super-block, then in float32 and in C
  order: ``d = f16(x.d) * y.d``; ``sums[l] += d * (float)aux32[l]`` for l = 0..7;
  (q4_K/q5_K) ``dmin = f16(x.dmin) * y.d; sumf -= dmin * (float)sumi`` with
  ``sumi = sum_j bsums[j] * mins[j/2]``; at the end ``sumf += sums[l]`` for l = 0..7.
  Integer sums are exact, so how they are formed does not matter: the kernels
  pre-multiply each unpacked weight by its sub-block scale once per weight row (int16)
  and reuse it for all activation rows.
* ``matmul_q8_0`` == ``ggml_vec_dot_q8_0_q8_0_generic``:
  ``sumf += (float)sumi * (f16(x.d) * f16(y.d))`` per 32-block, blocks in order.
* ``matmul_f32`` == the scalar (non-SIMD) ``ggml_vec_dot_f32`` of
  ggml/src/ggml-cpu/vec.cpp: ``ggml_float sumf = 0; sumf += (ggml_float)(x[i]*y[i])``,
  i.e. each product rounded to float32, accumulated sequentially (i = 0, 1, ...) in
  DOUBLE, and the sum rounded to float32 once at the end.  (ggml's SIMD path instead
  uses several float32 FMA accumulators; that order is machine dependent and not
  reproduced.)
* ``dequantize_rows`` == ``dequantize_row_*`` in ggml-quants.c, which is also
  ``gguf.quants.dequantize`` bit for bit (float32: ``(d*sc)*q - (dmin*m)`` etc.).
* ``matmul`` is the one dispatcher (the forward pass and the tests call it): it quantizes
  an ``Activation`` to the weight type's vec_dot_type (engine/qtypes.py) once and runs
  that type's kernel.

Determinism: kernels are ``parallel=True`` with ``prange`` over fixed chunks of OUTPUT
rows only; every output element is produced by one sequential loop whose order does not
depend on the thread count, so results are bit-identical for any ``set_threads``.
No fastmath anywhere (it would allow reassociation/contraction); every float operation
is written on np.float32 operands so numba does not widen to float64.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from engine.qtypes import F32, Q4_K, Q5_K, Q6_K, Q8_0, Q8_K, QK8_0, QK_K, QTYPES, qtype_info

# Block sizes as module constants: numba freezes them into the kernels.
_Q8_0_BYTES = QTYPES[Q8_0].block_bytes
_Q4_K_BYTES = QTYPES[Q4_K].block_bytes
_Q5_K_BYTES = QTYPES[Q5_K].block_bytes
_Q6_K_BYTES = QTYPES[Q6_K].block_bytes

# Output rows handled by one parallel work item (scratch buffers are per item).
_CHUNK = 8


def set_threads(n: int) -> None:
    """Set the number of numba worker threads (results do not depend on it)."""
    numba.set_num_threads(int(n))


def get_threads() -> int:
    return numba.get_num_threads()


# --------------------------------------------------------------------------- helpers

# _POW2[e] = 2**(e - 25) (exact in float64); a frozen constant inside the kernels.
_POW2 = np.array([2.0 ** (e - 25) for e in range(32)], dtype=np.float64)


@njit(cache=True, inline="always")
def _f16(lo, hi):
    """IEEE binary16 (little-endian bytes lo, hi) -> float32, exact (incl. subnormals).

    normal: (1024 + m) * 2**(e-25); subnormal: m * 2**-24 (= m * _POW2[1]); both exact."""
    h = np.int32(lo) | (np.int32(hi) << 8)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = np.float64(m) * _POW2[1]
    elif e == 31:
        v = math.inf if m == 0 else math.nan
    else:
        v = np.float64(m | 0x400) * _POW2[e]
    if h & 0x8000:
        v = -v
    return np.float32(v)


@njit(cache=True, inline="always")
def _scale_min_k4(q, off, j):
    """get_scale_min_k4(j, q + off) of ggml-quants.c -> (sc, m) as int32."""
    if j < 4:
        sc = np.int32(q[off + j]) & 63
        mn = np.int32(q[off + j + 4]) & 63
    else:
        sc = (np.int32(q[off + j + 4]) & 0xF) | ((np.int32(q[off + j - 4]) >> 6) << 4)
        mn = (np.int32(q[off + j + 4]) >> 4) | ((np.int32(q[off + j]) >> 6) << 4)
    return sc, mn


# ------------------------------------------------------------- activation quantization

@njit(cache=True)
def quantize_q8_K(x):
    """x float32[n, k] (k % 256 == 0) -> (d f32[n, k/256], qs i8[n, k], bsums i16[n, k/16])."""
    n, k = x.shape
    if k % QK_K != 0:
        raise ValueError("quantize_q8_K: k must be a multiple of 256")
    nb = k // QK_K
    d = np.zeros((n, nb), np.float32)
    qs = np.zeros((n, k), np.int8)
    bsums = np.zeros((n, k // 16), np.int16)
    magic = np.float32(12582912.0)
    m127 = np.float32(-127.0)
    one = np.float32(1.0)
    for r in range(n):
        for i in range(nb):
            base = i * QK_K
            mx = np.float32(0.0)
            amax = np.float32(0.0)
            for j in range(QK_K):
                v = np.float32(x[r, base + j])
                ax = abs(v)
                if ax > amax:
                    amax = ax
                    mx = v
            if amax == 0:
                continue  # d = 0, qs = 0, bsums = 0
            iscale = m127 / mx
            for j in range(QK_K):
                # nearest_int(): (fval + 12582912.f) in float32, then the integer part
                t = np.float32(iscale * np.float32(x[r, base + j])) + magic
                v = np.int32(t) - np.int32(12582912)
                if v > 127:
                    v = np.int32(127)
                qs[r, base + j] = v
            for g in range(QK_K // 16):
                s = np.int32(0)
                for l in range(16):
                    s += np.int32(qs[r, base + 16 * g + l])
                bsums[r, i * 16 + g] = s
            d[r, i] = one / iscale
    return d, qs, bsums


@njit(cache=True)
def _quantize_q8_0_raw(x):
    n, k = x.shape
    nb = k // QK8_0
    d = np.zeros((n, nb), np.float32)
    qs = np.zeros((n, k), np.int8)
    c127 = np.float32(127.0)
    one = np.float32(1.0)
    for r in range(n):
        for i in range(nb):
            base = i * QK8_0
            amax = np.float32(0.0)
            for j in range(QK8_0):
                a = abs(np.float32(x[r, base + j]))
                amax = amax if amax > a else a  # MAX(amax, fabsf(v)) as the C macro
            dd = amax / c127
            idd = one / dd if dd != 0 else np.float32(0.0)
            for j in range(QK8_0):
                x0 = np.float32(np.float32(x[r, base + j]) * idd)
                # roundf: half away from zero (exact: float32 + 0.5 is exact in float64)
                a = math.floor(abs(float(x0)) + 0.5)
                if x0 < 0:
                    a = -a
                qs[r, base + j] = np.int32(a)
            d[r, i] = dd
    return d, qs


def quantize_q8_0(x):
    """x float32[n, k] (k % 32 == 0) -> (d f32[n, k/32] = value of the f16 scale, qs i8[n, k])."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK8_0 != 0:
        raise ValueError("quantize_q8_0: x must be (n, k) with k % 32 == 0")
    d, qs = _quantize_q8_0_raw(x)
    # GGML_FP32_TO_FP16 rounds to nearest even, as numpy's float32 -> float16 cast does.
    return d.astype(np.float16).astype(np.float32), qs


# ------------------------------------------------------------- weight row unpacking

@njit(cache=True, inline="always")
def _unpack_q45_K_row(wr, nb, ws, xd, xm, mins, five):
    """Q4_K/Q5_K row: ws[p] = sc(p) * q(p) (int16), xd/xm = f16 d/dmin, mins[8*i + j]."""
    bpb = _Q5_K_BYTES if five else _Q4_K_BYTES
    for i in range(nb):
        blk = wr[i * bpb:(i + 1) * bpb]
        xd[i] = _f16(blk[0], blk[1])
        xm[i] = _f16(blk[2], blk[3])
        qh = blk[16:48]
        for c in range(4):
            sc0, m0 = _scale_min_k4(blk, 4, 2 * c)
            sc1, m1 = _scale_min_k4(blk, 4, 2 * c + 1)
            mins[i * 8 + 2 * c] = m0
            mins[i * 8 + 2 * c + 1] = m1
            qoff = (48 if five else 16) + 32 * c
            ql = blk[qoff:qoff + 32]
            lo = ws[i * QK_K + 64 * c:i * QK_K + 64 * c + 32]
            hi = ws[i * QK_K + 64 * c + 32:i * QK_K + 64 * c + 64]
            if five:
                for l in range(32):
                    q = np.int32(ql[l])
                    h = np.int32(qh[l])
                    lo[l] = sc0 * ((q & 0xF) | (((h >> (2 * c)) & 1) << 4))
                    hi[l] = sc1 * ((q >> 4) | (((h >> (2 * c + 1)) & 1) << 4))
            else:
                for l in range(32):
                    q = np.int32(ql[l])
                    lo[l] = sc0 * (q & 0xF)
                    hi[l] = sc1 * (q >> 4)


@njit(cache=True, inline="always")
def _unpack_q6_K_row(wr, nb, ws, xd):
    """Q6_K row: ws[p] = scales[p // 16] * (q6(p) - 32) (int16), xd = f16 d."""
    for i in range(nb):
        blk = wr[i * _Q6_K_BYTES:(i + 1) * _Q6_K_BYTES]
        xd[i] = _f16(blk[208], blk[209])
        for half in range(2):
            ql = blk[64 * half:64 * half + 64]
            qh = blk[128 + 32 * half:160 + 32 * half]
            sc = blk[192 + 8 * half:200 + 8 * half]  # 8 scales of this 128-value half
            out = ws[i * QK_K + 128 * half:i * QK_K + 128 * half + 128]
            for part in range(2):  # l in [0, 16) and [16, 32): one scale index each
                s1 = np.int32(np.int8(sc[part + 0]))
                s2 = np.int32(np.int8(sc[part + 2]))
                s3 = np.int32(np.int8(sc[part + 4]))
                s4 = np.int32(np.int8(sc[part + 6]))
                for ll in range(16):
                    l = 16 * part + ll
                    a = np.int32(ql[l])
                    b = np.int32(ql[l + 32])
                    h = np.int32(qh[l])
                    out[l] = s1 * (((a & 0xF) | ((h & 3) << 4)) - 32)
                    out[l + 32] = s2 * (((b & 0xF) | (((h >> 2) & 3) << 4)) - 32)
                    out[l + 64] = s3 * (((a >> 4) | (((h >> 4) & 3) << 4)) - 32)
                    out[l + 96] = s4 * (((b >> 4) | (((h >> 6) & 3) << 4)) - 32)


# ------------------------------------------------------------- per-row dot products

@njit(cache=True, inline="always")
def _rows_kquant(ws, xd, xm, mins, has_min, nb, d, qs, bsums, t, acc8, accf, out, r):
    """out[j, r] for all activation rows j, each exactly ggml_vec_dot_q{4,5,6}_K_q8_K_generic.

    ws: int16[nb*256] scale-premultiplied weights of row r (see module doc); t: int32[256]
    scratch; acc8 float32[n, 8] (C: sums[8]) and accf float32[n] (C: sumf) hold each
    output's float32 state while super-blocks are processed in order i = 0..nb-1.
    aux32[l] = sum of ws*q8 over positions = l (mod 8) of a super-block, computed exactly
    (products into t, then 8 lane sums).
    """
    n = qs.shape[0]
    for j in range(n):
        accf[j] = np.float32(0.0)
        for l in range(8):
            acc8[j, l] = np.float32(0.0)
    for i in range(nb):
        w = ws[i * QK_K:(i + 1) * QK_K]
        for j in range(n):
            q = qs[j, i * QK_K:(i + 1) * QK_K]
            for p in range(QK_K):
                t[p] = np.int32(w[p]) * np.int32(q[p])
            a0 = np.int32(0)
            a1 = np.int32(0)
            a2 = np.int32(0)
            a3 = np.int32(0)
            a4 = np.int32(0)
            a5 = np.int32(0)
            a6 = np.int32(0)
            a7 = np.int32(0)
            for g in range(QK_K // 8):
                o = 8 * g
                a0 += t[o]
                a1 += t[o + 1]
                a2 += t[o + 2]
                a3 += t[o + 3]
                a4 += t[o + 4]
                a5 += t[o + 5]
                a6 += t[o + 6]
                a7 += t[o + 7]
            yd = d[j, i]
            dd = np.float32(xd[i] * yd)
            acc8[j, 0] = np.float32(acc8[j, 0] + np.float32(dd * np.float32(a0)))
            acc8[j, 1] = np.float32(acc8[j, 1] + np.float32(dd * np.float32(a1)))
            acc8[j, 2] = np.float32(acc8[j, 2] + np.float32(dd * np.float32(a2)))
            acc8[j, 3] = np.float32(acc8[j, 3] + np.float32(dd * np.float32(a3)))
            acc8[j, 4] = np.float32(acc8[j, 4] + np.float32(dd * np.float32(a4)))
            acc8[j, 5] = np.float32(acc8[j, 5] + np.float32(dd * np.float32(a5)))
            acc8[j, 6] = np.float32(acc8[j, 6] + np.float32(dd * np.float32(a6)))
            acc8[j, 7] = np.float32(acc8[j, 7] + np.float32(dd * np.float32(a7)))
            if has_min:
                sumi = np.int32(0)
                for jj in range(QK_K // 16):
                    sumi += np.int32(bsums[j, i * 16 + jj]) * mins[i * 8 + jj // 2]
                dmin = np.float32(xm[i] * yd)
                accf[j] = np.float32(accf[j] - np.float32(dmin * np.float32(sumi)))
    for j in range(n):
        sumf = accf[j]
        for l in range(8):
            sumf = np.float32(sumf + acc8[j, l])
        out[j, r] = sumf


@njit(cache=True, parallel=True)
def matmul_kquant(w, qtype, d, qs, bsums):
    """w uint8[rows, nb*block bytes] of type Q4_K, Q5_K or Q6_K, Q8_K activations (d, qs, bsums)
    of x[n, k] -> float32[n, rows]. One kernel for the three: they differ only in how a row
    is unpacked (Q6_K has no mins, so bsums is unused for it)."""
    rows = w.shape[0]
    n, k = qs.shape
    nb = k // QK_K
    if qtype == Q4_K:
        bb = _Q4_K_BYTES
    elif qtype == Q5_K:
        bb = _Q5_K_BYTES
    elif qtype == Q6_K:
        bb = _Q6_K_BYTES
    else:
        raise ValueError("matmul_kquant: not a k-quant type")
    has_min = qtype != Q6_K
    if (k % QK_K != 0 or w.shape[1] != nb * bb or d.shape != (n, nb)
            or (has_min and bsums.shape != (n, nb * 16))):
        raise ValueError("matmul_kquant: shape mismatch")
    out = np.empty((n, rows), np.float32)
    nch = (rows + _CHUNK - 1) // _CHUNK
    for c in prange(nch):
        ws = np.empty(k, np.int16)
        xd = np.empty(nb, np.float32)
        xm = np.empty(nb, np.float32)
        mins = np.empty(nb * 8, np.int32)
        t = np.empty(QK_K, np.int32)
        acc8 = np.empty((n, 8), np.float32)
        accf = np.empty(n, np.float32)
        for r in range(c * _CHUNK, min(rows, (c + 1) * _CHUNK)):
            if has_min:
                _unpack_q45_K_row(w[r], nb, ws, xd, xm, mins, qtype == Q5_K)
            else:
                _unpack_q6_K_row(w[r], nb, ws, xd)
            _rows_kquant(ws, xd, xm, mins, has_min, nb, d, qs, bsums, t, acc8, accf, out, r)
    return out


@njit(cache=True, parallel=True)
def matmul_q8_0(w, d, qs):
    """w uint8[rows, nb*34], Q8_0 activations (d = f16 values as f32, qs) -> float32[n, rows]."""
    rows = w.shape[0]
    n, k = qs.shape
    nb = k // QK8_0
    if k % QK8_0 != 0 or w.shape[1] != nb * _Q8_0_BYTES or d.shape[0] != n:
        raise ValueError("matmul_q8_0: shape mismatch")
    out = np.empty((n, rows), np.float32)
    nch = (rows + _CHUNK - 1) // _CHUNK
    for c in prange(nch):
        wq = np.empty(k, np.int8)
        xd = np.empty(nb, np.float32)
        for r in range(c * _CHUNK, min(rows, (c + 1) * _CHUNK)):
            wr = w[r]
            for i in range(nb):
                o = i * _Q8_0_BYTES
                xd[i] = _f16(wr[o], wr[o + 1])
                for l in range(QK8_0):
                    wq[i * QK8_0 + l] = np.int8(wr[o + 2 + l])
            for j in range(n):
                yq = qs[j]
                yd = d[j]
                sumf = np.float32(0.0)
                for i in range(nb):
                    wb = wq[i * QK8_0:(i + 1) * QK8_0]
                    yb = yq[i * QK8_0:(i + 1) * QK8_0]
                    sumi = np.int32(0)
                    for l in range(QK8_0):
                        sumi += np.int32(wb[l]) * np.int32(yb[l])
                    sumf = np.float32(sumf + np.float32(np.float32(sumi) * np.float32(xd[i] * yd[i])))
                out[j, r] = sumf
    return out


@njit(cache=True, parallel=True)
def matmul_f32(w, x):
    """w float32[rows, k], x float32[n, k] -> float32[n, rows].

    out[j, r] = float32( sum_i double(float32(w[r, i] * x[j, i])) ), summed sequentially
    i = 0..k-1 in double (scalar ggml_vec_dot_f32).  Four output rows are advanced
    together (independent chains) for throughput; that does not change any chain.
    """
    rows, k = w.shape
    n = x.shape[0]
    if x.shape[1] != k:
        raise ValueError("matmul_f32: shape mismatch")
    out = np.empty((n, rows), np.float32)
    nch = (rows + _CHUNK - 1) // _CHUNK
    for c in prange(nch):
        r0 = c * _CHUNK
        r1 = min(rows, r0 + _CHUNK)
        for j in range(n):
            xj = x[j]
            r = r0
            while r + 4 <= r1:
                w0 = w[r]
                w1 = w[r + 1]
                w2 = w[r + 2]
                w3 = w[r + 3]
                s0 = 0.0
                s1 = 0.0
                s2 = 0.0
                s3 = 0.0
                for i in range(k):
                    xv = xj[i]
                    s0 += np.float64(np.float32(w0[i] * xv))
                    s1 += np.float64(np.float32(w1[i] * xv))
                    s2 += np.float64(np.float32(w2[i] * xv))
                    s3 += np.float64(np.float32(w3[i] * xv))
                out[j, r] = np.float32(s0)
                out[j, r + 1] = np.float32(s1)
                out[j, r + 2] = np.float32(s2)
                out[j, r + 3] = np.float32(s3)
                r += 4
            while r < r1:
                wr = w[r]
                s0 = 0.0
                for i in range(k):
                    s0 += np.float64(np.float32(wr[i] * xj[i]))
                out[j, r] = np.float32(s0)
                r += 1
    return out


# ------------------------------------------------------------- dequantization

@njit(cache=True, parallel=True)
def _dequant_q8_0(w):
    rows = w.shape[0]
    nb = w.shape[1] // _Q8_0_BYTES
    out = np.empty((rows, nb * QK8_0), np.float32)
    for r in prange(rows):
        for i in range(nb):
            o = i * _Q8_0_BYTES
            dd = _f16(w[r, o], w[r, o + 1])
            for l in range(QK8_0):
                out[r, i * QK8_0 + l] = np.float32(np.float32(np.int8(w[r, o + 2 + l])) * dd)
    return out


@njit(cache=True, parallel=True)
def _dequant_q45_K(w, five):
    rows = w.shape[0]
    bpb = _Q5_K_BYTES if five else _Q4_K_BYTES
    nb = w.shape[1] // bpb
    out = np.empty((rows, nb * QK_K), np.float32)
    for r in prange(rows):
        for i in range(nb):
            o = i * bpb
            dd = _f16(w[r, o], w[r, o + 1])
            dm = _f16(w[r, o + 2], w[r, o + 3])
            qo = o + (48 if five else 16)
            for c in range(4):
                sc0, m0 = _scale_min_k4(w[r], o + 4, 2 * c)
                sc1, m1 = _scale_min_k4(w[r], o + 4, 2 * c + 1)
                d1 = np.float32(dd * np.float32(sc0))
                mm1 = np.float32(dm * np.float32(m0))
                d2 = np.float32(dd * np.float32(sc1))
                mm2 = np.float32(dm * np.float32(m1))
                p = i * QK_K + 64 * c
                for l in range(32):
                    q = np.int32(w[r, qo + 32 * c + l])
                    lo = q & 0xF
                    hi = q >> 4
                    if five:
                        h = np.int32(w[r, o + 16 + l])
                        lo += ((h >> (2 * c)) & 1) << 4
                        hi += ((h >> (2 * c + 1)) & 1) << 4
                    out[r, p + l] = np.float32(np.float32(d1 * np.float32(lo)) - mm1)
                    out[r, p + 32 + l] = np.float32(np.float32(d2 * np.float32(hi)) - mm2)
    return out


@njit(cache=True, parallel=True)
def _dequant_q6_K(w):
    rows = w.shape[0]
    nb = w.shape[1] // _Q6_K_BYTES
    out = np.empty((rows, nb * QK_K), np.float32)
    for r in prange(rows):
        for i in range(nb):
            o = i * _Q6_K_BYTES
            dd = _f16(w[r, o + 208], w[r, o + 209])
            for half in range(2):
                ql = o + 64 * half
                qh = o + 128 + 32 * half
                p = i * QK_K + 128 * half
                for l in range(32):
                    a = np.int32(w[r, ql + l])
                    b = np.int32(w[r, ql + 32 + l])
                    h = np.int32(w[r, qh + l])
                    q1 = ((a & 0xF) | (((h >> 0) & 3) << 4)) - 32
                    q2 = ((b & 0xF) | (((h >> 2) & 3) << 4)) - 32
                    q3 = ((a >> 4) | (((h >> 4) & 3) << 4)) - 32
                    q4 = ((b >> 4) | (((h >> 6) & 3) << 4)) - 32
                    e = 128 * half + l
                    s1 = np.float32(np.int8(w[r, o + 192 + e // 16]))
                    s2 = np.float32(np.int8(w[r, o + 192 + (e + 32) // 16]))
                    s3 = np.float32(np.int8(w[r, o + 192 + (e + 64) // 16]))
                    s4 = np.float32(np.int8(w[r, o + 192 + (e + 96) // 16]))
                    out[r, p + l] = np.float32(np.float32(dd * s1) * np.float32(q1))
                    out[r, p + 32 + l] = np.float32(np.float32(dd * s2) * np.float32(q2))
                    out[r, p + 64 + l] = np.float32(np.float32(dd * s3) * np.float32(q3))
                    out[r, p + 96 + l] = np.float32(np.float32(dd * s4) * np.float32(q4))
    return out


def _dequant_q4_K(w):
    return _dequant_q45_K(w, False)


def _dequant_q5_K(w):
    return _dequant_q45_K(w, True)


_DEQUANTIZE = {Q8_0: _dequant_q8_0, Q4_K: _dequant_q4_K, Q5_K: _dequant_q5_K, Q6_K: _dequant_q6_K}


def dequantize_rows(w: np.ndarray, qtype: int) -> np.ndarray:
    """Rows of a tensor of qtype (uint8[rows, row_bytes]; float32[rows, k] for F32) ->
    float32[rows, k]."""
    t = qtype_info(qtype)
    if t.vec_dot_type == F32:
        return np.ascontiguousarray(w, dtype=np.float32)
    w = np.ascontiguousarray(w, dtype=np.uint8)
    if w.ndim != 2 or w.shape[1] % t.block_bytes:
        raise ValueError(f"dequantize_rows: {t.name} rows must be (rows, n * {t.block_bytes}) bytes, "
                         f"got shape {w.shape}")
    return _DEQUANTIZE[int(qtype)](w)


# ------------------------------------------------------------- dispatcher

class Activation:
    """Rows x[n, k] as float32, quantized at most once per activation type (vec_dot_type),
    however many weight matrices multiply them."""

    def __init__(self, x: np.ndarray):
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        if self.x.ndim != 2:
            raise ValueError(f"activations must be 2-D (rows, k), got shape {self.x.shape}")
        self._quantized: dict[int, tuple] = {}

    def quantized(self, vec_dot_type: int) -> tuple:
        q = self._quantized.get(vec_dot_type)
        if q is None:
            q = self._quantized[vec_dot_type] = _QUANTIZE[vec_dot_type](self.x)
        return q

    def rows(self, idx: np.ndarray) -> "Activation":
        """The rows idx, with what is quantized already (quantization is per row)."""
        sub = Activation(self.x[idx])
        sub._quantized = {t: tuple(np.ascontiguousarray(a[idx]) for a in q) for t, q in self._quantized.items()}
        return sub


_QUANTIZE = {Q8_K: quantize_q8_K, Q8_0: quantize_q8_0, F32: lambda x: (x,)}


def _kquant(qtype: int):
    return lambda w, d, qs, bsums: matmul_kquant(w, qtype, d, qs, bsums)


_MATMUL = {Q4_K: _kquant(Q4_K), Q5_K: _kquant(Q5_K), Q6_K: _kquant(Q6_K), Q8_0: matmul_q8_0, F32: matmul_f32}


def matmul(w: np.ndarray, qtype: int, a: Activation | np.ndarray) -> np.ndarray:
    """y[n, rows] = W x as ggml's CPU backend computes it, for weight rows w of type qtype
    (uint8[rows, row_bytes]; float32[rows, k] for F32) and activations a (x float32[n, k]):
    x is quantized to the type's vec_dot_type, then the type's kernel runs."""
    t = qtype_info(qtype)
    if not isinstance(a, Activation):
        a = Activation(a)
    return _MATMUL[int(qtype)](w, *a.quantized(t.vec_dot_type))
