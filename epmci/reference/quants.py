"""Quantization math of the reference, written from ggml's C sources: one class per type.

As gguf-py's quants.py, each weight type is one small class registered in a table by its
GGMLQuantizationType (`_TYPES`); `dequantize`, `quantize_activation` and `matmul` are
lookups in that table with no per-type branching. A class holds everything about its
type, in the order of the C block layout: `unpack` (the block's integer fields),
`dequantize_blocks`, its `activation` (the vec_dot_type: Q8_K, Q8_0, F32 or F16) and
`dot` (ggml_vec_dot_<type>_<vec_dot_type>_generic).

Independent of gguf.quants (the tests use that only as a cross-check). Sources:
ggml/src/ggml-common.h (block layouts), ggml/src/ggml-quants.c (dequantize_row_*,
quantize_row_q8_0_ref, quantize_row_q8_K_ref) and ggml/src/ggml-cpu/quants.c
(ggml_vec_dot_*_generic) of llama.cpp.

Float rules: every float op is done in float32 in the same order as the C code, one
rounding per op (the C has FLT_EVAL_METHOD 0 on x86-64; we model a build without FMA
contraction, i.e. -ffp-contract=off).  Integer inner sums are exact (int64).

Layout convention: a quantized row is a uint8 array of bytes, last axis = bytes of a row.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

QK_K = 256
QK8_0 = 32


def _qtype(qtype) -> QT:
    if isinstance(qtype, str):
        return QT[qtype.upper()]
    return QT(qtype)


def row_bytes(qtype, n_values: int) -> int:
    """Bytes of one row of n_values values of type qtype (ggml_row_size)."""
    block_size, type_size = GGML_QUANT_SIZES[_qtype(qtype)]
    if n_values % block_size:
        raise ValueError(f"{n_values} values is not a multiple of the block size {block_size}")
    return n_values // block_size * type_size


def _f16(b: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 little-endian IEEE half -> (n,) float32 (exact, as GGML_FP16_TO_FP32)."""
    return np.ascontiguousarray(b).view("<f2").reshape(-1).astype(np.float32)


# ---------------------------------------------------------------------------------------
# Activation types (the vec_dot_type a weight type multiplies with)
# ---------------------------------------------------------------------------------------

def _nearest_int(fval: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: add 1.5*2^23 in float32 and read the low mantissa bits.
    For |fval| < 2^22 this is round-half-to-even; done literally so odd inputs match too."""
    val = (fval.astype(np.float32) + np.float32(12582912.0)).view(np.int32)
    return (val & 0x007FFFFF) - 0x00400000


def _roundf(v: np.ndarray) -> np.ndarray:
    """C roundf: nearest, ties away from zero (exact: a - floor(a) is exact in float32)."""
    a = np.abs(v)
    f = np.floor(a)
    r = f + (a - f >= np.float32(0.5)).astype(np.float32)
    return np.copysign(r, v)


def _rows(x: np.ndarray, block: int) -> tuple[np.ndarray, tuple[int, ...], int]:
    """float32 (..., k) -> ((n_blocks, block) float32, leading shape, k)."""
    x = np.asarray(x, dtype=np.float32)
    k = x.shape[-1]
    if k % block:
        raise ValueError(f"row length {k} is not a multiple of {block}")
    return x.reshape(-1, block), x.shape[:-1], k


class Q8K(NamedTuple):
    """block_q8_K fields for rows of k values: d (..., k/256) f32, qs (..., k) i8, bsums (..., k/16) i16."""
    d: np.ndarray
    qs: np.ndarray
    bsums: np.ndarray

    @classmethod
    def quantize(cls, x: np.ndarray) -> "Q8K":
        """quantize_row_q8_K_ref on float32 (..., k), k % 256 == 0."""
        xb, lead, k = _rows(x, QK_K)
        # max = the signed value with the largest |x|; the loop uses '>' so the first one wins
        idx = np.argmax(np.abs(xb), axis=1)
        vmax = xb[np.arange(xb.shape[0]), idx]
        zero = vmax == 0                                    # 'if (!amax)': d = 0, qs = 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            iscale = np.float32(-127.0) / np.where(zero, np.float32(1), vmax)   # float32 division
            v = _nearest_int(iscale[:, None] * xb)
            d = np.float32(1.0) / iscale
        qs = np.minimum(127, v).astype(np.int8)
        qs[zero] = 0
        d = np.where(zero, np.float32(0), d).astype(np.float32)
        bsums = qs.reshape(-1, QK_K // 16, 16).astype(np.int32).sum(axis=-1).astype(np.int16)
        return cls(d.reshape(*lead, k // QK_K), qs.reshape(*lead, k), bsums.reshape(*lead, k // 16))

    def dequantize(self) -> np.ndarray:
        # dequantize_row_q8_K: y = d * qs
        d = np.repeat(self.d, QK_K, axis=-1)
        return d * self.qs.astype(np.float32)


class Q80(NamedTuple):
    """block_q8_0 fields: d (..., k/32) f32 holding the f16-rounded scale, qs (..., k) i8."""
    d: np.ndarray
    qs: np.ndarray

    @classmethod
    def quantize(cls, x: np.ndarray) -> "Q80":
        """quantize_row_q8_0_ref on float32 (..., k), k % 32 == 0."""
        xb, lead, k = _rows(x, QK8_0)
        amax = np.max(np.abs(xb), axis=1)
        d = amax / np.float32(127)                          # float32: amax / ((1 << 7) - 1)
        with np.errstate(divide="ignore"):
            # id is computed from d *before* it is rounded to f16
            id_ = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        qs = _roundf(xb * id_[:, None]).astype(np.int8)
        d16 = d.astype(np.float16).astype(np.float32)       # y[i].d = GGML_FP32_TO_FP16(d) (RNE)
        return cls(d16.reshape(*lead, k // QK8_0), qs.reshape(*lead, k))

    def dequantize(self) -> np.ndarray:
        return self.qs.astype(np.float32) * np.repeat(self.d, QK8_0, axis=-1)


quantize_q8_K = Q8K.quantize
quantize_q8_0 = Q80.quantize


# ---------------------------------------------------------------------------------------
# Weight types: one class each, registered in _TYPES
# ---------------------------------------------------------------------------------------

_TYPES: dict[QT, type["_Quant"]] = {}


class _Quant:
    """A weight type. Subclasses give `qtype=` and get block_size/type_size from gguf-py's
    GGML_QUANT_SIZES; blocks are (n_blocks, type_size) uint8."""

    qtype: ClassVar[QT]
    block_size: ClassVar[int]
    type_size: ClassVar[int]
    activation: ClassVar[type]           # what `dot` multiplies with

    def __init_subclass__(cls, qtype: QT | None = None, **kw):
        super().__init_subclass__(**kw)
        if qtype is not None:
            cls.qtype = qtype
            cls.block_size, cls.type_size = GGML_QUANT_SIZES[qtype]
            _TYPES[qtype] = cls

    @classmethod
    def blocks(cls, data: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
        """(..., row_bytes) uint8 -> ((n_blocks, type_size) uint8, output shape in values)."""
        data = np.ascontiguousarray(data, dtype=np.uint8)
        if data.ndim == 0 or data.shape[-1] % cls.type_size:
            raise ValueError(f"row of {data.shape[-1:]} bytes is not a whole number of {cls.qtype.name} blocks")
        oshape = (*data.shape[:-1], data.shape[-1] // cls.type_size * cls.block_size)
        return data.reshape(-1, cls.type_size), oshape

    @classmethod
    def dequantize_blocks(cls, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @staticmethod
    def quantize_activation(x: np.ndarray):
        raise NotImplementedError

    @classmethod
    def dot(cls, w: np.ndarray, a) -> np.ndarray:
        """Weights (r, row_bytes) uint8 x activation rows with leading (n,) -> (n, r) float32."""
        raise NotImplementedError

    @classmethod
    def _weight_blocks(cls, w: np.ndarray, a_len: int) -> tuple[np.ndarray, int]:
        """(r * nb, type_size) blocks of w and nb, checking the activation's length."""
        b, _ = cls.blocks(w)
        nb = b.shape[0] // w.shape[0]
        if a_len != nb * cls.block_size:
            raise ValueError("weight row and activation lengths differ")
        return b, nb


def _dot_float(w: np.ndarray, a: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 / _f16, scalar path: float32 product, summed in double (ggml_float)
    in element order, then stored as float.  w (r, k) float32, a (n, k) float32 -> (n, r)."""
    acc = np.zeros((a.shape[0], w.shape[0]), np.float64)
    for j in range(w.shape[1]):
        acc += (a[:, j, None] * w[None, :, j]).astype(np.float64)
    return acc.astype(np.float32)


class F32(_Quant, qtype=QT.F32):
    activation = np.ndarray

    @classmethod
    def dequantize_blocks(cls, b):
        return np.ascontiguousarray(b).view("<f4").astype(np.float32)

    @staticmethod
    def quantize_activation(x):
        return np.asarray(x, dtype=np.float32)

    @classmethod
    def dot(cls, w, a):
        return _dot_float(dequantize(w, cls.qtype), np.asarray(a, dtype=np.float32))


class F16(F32, qtype=QT.F16):
    # vec_dot_type F16: the activation is rounded to f16; f16 x f16 products are exact in
    # float32, so the scalar ggml_vec_dot_f16 is the F32 loop on the rounded values.
    @classmethod
    def dequantize_blocks(cls, b):
        return np.ascontiguousarray(b).view("<f2").astype(np.float32)

    @staticmethod
    def quantize_activation(x):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)

    @classmethod
    def dot(cls, w, a):
        return super().dot(w, F16.quantize_activation(a))


class Q8_0(_Quant, qtype=QT.Q8_0):
    activation = Q80
    quantize_activation = staticmethod(Q80.quantize)

    @staticmethod
    def unpack(b):
        # block_q8_0: d f16 @0, qs[32] int8 @2
        return _f16(b[:, 0:2]), b[:, 2:34].view(np.int8).astype(np.int64)

    @classmethod
    def dequantize_blocks(cls, b):
        d, qs = cls.unpack(b)
        return qs.astype(np.float32) * d[:, None]

    @classmethod
    def dot(cls, w, a):
        # ggml_vec_dot_q8_0_q8_0_generic
        r, n = w.shape[0], a.qs.shape[0]
        b, nb = cls._weight_blocks(w, a.qs.shape[1])
        xd, xq = cls.unpack(b)
        A = xq.reshape(r, nb, QK8_0).transpose(1, 0, 2)                     # (nb, r, 32)
        B = a.qs.astype(np.int64).reshape(n, nb, QK8_0).transpose(1, 2, 0)  # (nb, 32, n)
        sumi = int_matmul(A, B).transpose(0, 2, 1)                          # (nb, n, r) exact
        xd = xd.reshape(r, nb)
        yd = a.d.astype(np.float32)
        sumf = np.zeros((n, r), np.float32)
        for ib in range(nb):
            # sumf += sumi * (fp16(x.d) * fp16(y.d))
            dd = xd[None, :, ib] * yd[:, ib, None]
            sumf = sumf + sumi[ib].astype(np.float32) * dd
        return sumf


def int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b of integer arrays, exactly, through float64 BLAS (5-7x faster than NumPy's
    integer matmul): every product and partial sum of a quantized dot product is an integer
    far below 2**53 (at most 127 * 8128 * 256 per super-block), so no order of summation can
    round."""
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)


def _lanes(wq: np.ndarray, scale: np.ndarray, per_scale: int, a_qs: np.ndarray) -> np.ndarray:
    """aux32[l] of the K-quant dot products: for each super-block, lane l (0..7) sums
    scale * q8 * q over the values 8t + l, t = 0..31.  wq (r, nb, 256),
    scale (r, nb, 256/per_scale), a_qs (n, nb, 256) -> (nb, n, r, 8) int64."""
    r, nb, _ = wq.shape
    n = a_qs.shape[0]
    per_t = per_scale // 8                              # groups of 8 sharing one scale
    ws = wq.reshape(r, nb, 32, 8) * np.repeat(scale, per_t, axis=2)[..., None]
    A = ws.transpose(1, 3, 0, 2)                        # (nb, 8, r, 32)
    B = a_qs.reshape(n, nb, 32, 8).astype(np.int64).transpose(1, 3, 2, 0)   # (nb, 8, 32, n)
    return int_matmul(A, B).transpose(0, 3, 2, 1)        # (nb, n, r, 8), exact int64


def _lane_sums(d: np.ndarray, yd: np.ndarray, aux: np.ndarray) -> np.ndarray:
    """sums[l] += (fp16(x.d) * y.d) * aux32[l] over the super-blocks in order -> (n, r, 8)."""
    sums = np.zeros((yd.shape[0], d.shape[0], 8), np.float32)
    for i in range(d.shape[1]):
        di = d[None, :, i] * yd[:, i, None]
        sums = sums + di[..., None] * aux[i].astype(np.float32)
    return sums


def _add_lanes(sumf: np.ndarray, sums: np.ndarray) -> np.ndarray:
    for l in range(8):                                  # sumf += sums[l], l = 0..7
        sumf = sumf + sums[..., l]
    return sumf


class _ScaleMinK(_Quant):
    """Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit (scale, min) pairs, y = d*sc*q - dmin*m."""

    activation = Q8K
    quantize_activation = staticmethod(Q8K.quantize)

    @staticmethod
    def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """get_scale_min_k4 for j = 0..7: (n, 12) uint8 -> sc, m each (n, 8) int64 in 0..63."""
        q = scales.astype(np.int64)
        sc = np.empty((q.shape[0], 8), np.int64)
        m = np.empty((q.shape[0], 8), np.int64)
        sc[:, :4] = q[:, 0:4] & 63
        m[:, :4] = q[:, 4:8] & 63
        # j >= 4: low 4 bits from q[j+4], high 2 bits from the top of q[j-4] (sc) / q[j] (m)
        sc[:, 4:] = (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)
        m[:, 4:] = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
        return sc, m

    @staticmethod
    def _nibbles(qs: np.ndarray) -> np.ndarray:
        """(n, 128) packed nibbles -> (n, 256): chunk c of 64 values = 32 low nibbles, then 32 high."""
        qs = qs.reshape(-1, 4, 32).astype(np.int64)
        return np.concatenate([qs & 0xF, qs >> 4], axis=-1).reshape(-1, QK_K)

    @classmethod
    def unpack(cls, b):
        """-> d, dmin (n,) float32; sc, m (n, 8); q (n, 256) unsigned quants."""
        raise NotImplementedError

    @classmethod
    def dequantize_blocks(cls, b):
        d, dmin, sc, m, q = cls.unpack(b)
        # d1 = d * sc; m1 = min * m; y = d1 * q - m1   (three float32 roundings, in this order)
        d1 = d[:, None] * sc.astype(np.float32)             # (n, 8)
        m1 = dmin[:, None] * m.astype(np.float32)
        return np.repeat(d1, 32, axis=1) * q.astype(np.float32) - np.repeat(m1, 32, axis=1)

    @classmethod
    def dot(cls, w, a):
        # ggml_vec_dot_q4_K_q8_K_generic / _q5_K_
        r, n = w.shape[0], a.qs.shape[0]
        b, nb = cls._weight_blocks(w, a.qs.shape[1])
        yd = a.d.astype(np.float32)                         # (n, nb)
        d, dmin, sc, m, q = cls.unpack(b)
        aux = _lanes(q.reshape(r, nb, QK_K), sc.reshape(r, nb, 8), 32, a.qs)
        # sumi = sum_j bsums[j] * mins[j/2]   (exact, from the activation's stored bsums)
        mins16 = np.repeat(m.reshape(r, nb, 8), 2, axis=2).transpose(1, 0, 2)   # (nb, r, 16)
        bs = a.bsums.astype(np.int64).reshape(n, nb, 16).transpose(1, 2, 0)     # (nb, 16, n)
        sumi = int_matmul(mins16, bs).transpose(0, 2, 1)                                # (nb, n, r)
        d, dmin = d.reshape(r, nb), dmin.reshape(r, nb)
        sums = _lane_sums(d, yd, aux)
        sumf = np.zeros((n, r), np.float32)
        for i in range(nb):
            dmi = dmin[None, :, i] * yd[:, i, None]                     # dmin = fp16(x.dmin) * y.d
            sumf = sumf - dmi * sumi[i].astype(np.float32)              # sumf -= dmin * sumi
        return _add_lanes(sumf, sums)


class Q4_K(_ScaleMinK, qtype=QT.Q4_K):
    @classmethod
    def unpack(cls, b):
        # block_q4_K: d f16 @0, dmin f16 @2, scales[12] @4, qs[128] @16
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, m = cls._scale_min_k4(b[:, 4:16])
        return d, dmin, sc, m, cls._nibbles(b[:, 16:144])   # q 0..15


class Q5_K(_ScaleMinK, qtype=QT.Q5_K):
    @classmethod
    def unpack(cls, b):
        # block_q5_K: d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, m = cls._scale_min_k4(b[:, 4:16])
        q = cls._nibbles(b[:, 48:176])
        # sub-block s (32 values) takes its 5th bit from bit s of qh[l] (u1 = 1<<2c, u2 = 2<<2c)
        qh = b[:, 16:48].astype(np.int64)
        hbit = (qh[:, None, :] >> np.arange(8)[None, :, None]) & 1          # (n, 8, 32)
        return d, dmin, sc, m, q + 16 * hbit.reshape(-1, QK_K)              # q 0..31


class Q6_K(_Quant, qtype=QT.Q6_K):
    activation = Q8K
    quantize_activation = staticmethod(Q8K.quantize)

    @staticmethod
    def unpack(b):
        """-> d (n,) float32, sc (n, 16) int8 scales of 16 values, q (n, 256) in -32..31."""
        # block_q6_K: ql[128] @0, qh[64] @128, scales[16] int8 @192, d f16 @208
        ql = b[:, 0:128].reshape(-1, 2, 64).astype(np.int64)       # two halves of 128 values
        qh = b[:, 128:192].reshape(-1, 2, 32).astype(np.int64)
        # half h, l < 32: value 32*g + l takes 4 bits from ql (g=0: ql[l]&F, 1: ql[l+32]&F,
        # 2: ql[l]>>4, 3: ql[l+32]>>4) and 2 bits from (qh[l] >> 2g) & 3
        low = np.concatenate([ql & 0xF, ql >> 4], axis=-1)          # (n, 2, 128)
        high = (qh[:, :, None, :] >> (2 * np.arange(4))[None, None, :, None]) & 3   # (n, 2, 4, 32)
        q = (low | (high.reshape(-1, 2, 128) << 4)).reshape(-1, QK_K) - 32
        sc = b[:, 192:208].view(np.int8).astype(np.int64)           # scale of value e: sc[e // 16]
        return _f16(b[:, 208:210]), sc, q

    @classmethod
    def dequantize_blocks(cls, b):
        d, sc, q = cls.unpack(b)
        # y = d * sc[is] * q  parses as (d * sc) * q
        dsc = d[:, None] * sc.astype(np.float32)        # (n, 16)
        return np.repeat(dsc, 16, axis=1) * q.astype(np.float32)

    @classmethod
    def dot(cls, w, a):
        # ggml_vec_dot_q6_K_q8_K_generic
        r, n = w.shape[0], a.qs.shape[0]
        b, nb = cls._weight_blocks(w, a.qs.shape[1])
        d, sc, q = cls.unpack(b)
        aux = _lanes(q.reshape(r, nb, QK_K), sc.reshape(r, nb, 16), 16, a.qs)
        sums = _lane_sums(d.reshape(r, nb), a.d.astype(np.float32), aux)
        return _add_lanes(np.zeros((n, r), np.float32), sums)


# ---------------------------------------------------------------------------------------
# The public functions: table lookups
# ---------------------------------------------------------------------------------------

def quant_type(qtype) -> type[_Quant]:
    """The class of a weight type; ValueError for a type the reference does not implement."""
    qt = _qtype(qtype)
    try:
        return _TYPES[qt]
    except KeyError:
        raise ValueError(f"unsupported type {qt.name}") from None


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """uint8 (..., row_bytes) -> float32 (..., values_per_row).  Any leading shape."""
    t = quant_type(qtype)
    b, oshape = t.blocks(data)
    return t.dequantize_blocks(b).reshape(oshape)


def quantize_activation(x: np.ndarray, qtype):
    """Activation in the weight type's vec_dot_type: Q8_K for Q4_K/Q5_K/Q6_K, Q8_0 for Q8_0,
    float32 for F32, f16-rounded float32 for F16."""
    return quant_type(qtype).quantize_activation(np.asarray(x, dtype=np.float32))


_DOT_CHUNK_BYTES = 256 * 2**20


def _matvec_batch(w: np.ndarray, qtype, a) -> np.ndarray:
    """w (r, row_bytes) uint8; a with leading (n,) -> (n, r) float32."""
    t = quant_type(qtype)
    w = np.asarray(w, dtype=np.uint8)
    if w.ndim != 2:
        raise ValueError("weights must be (rows, row_bytes)")
    if not isinstance(a, t.activation):
        raise TypeError(f"{t.qtype.name} weights need a {t.activation.__name__} activation")
    n, k = (a.qs if isinstance(a, (Q8K, Q80)) else np.asarray(a)).shape
    # The dots hold int64/float64 intermediates of rows x (values + n x lanes per block):
    # the 248k-row output head at 64 activation rows would take ~8 GB in one go. Rows are
    # independent, so slices give the same bits in bounded memory.
    per_row = 8 * 4 * (k + n * max(1, k // 32))
    step = max(1, _DOT_CHUNK_BYTES // per_row)
    if w.shape[0] <= step:
        return t.dot(w, a)
    return np.concatenate([t.dot(w[i:i + step], a) for i in range(0, w.shape[0], step)], axis=1)


def _lead1(a):
    """Add a leading axis of 1 to an activation (Q8K, Q80 or float array)."""
    if isinstance(a, (Q8K, Q80)):
        return type(a)(*(np.asarray(f)[None] for f in a))
    return np.asarray(a)[None]


def matvec(w: np.ndarray, qtype, a) -> np.ndarray:
    """Weights (rows, row_bytes) uint8 times ONE quantized activation row -> float32 (rows,).
    a: Q8K (K-quants), Q80 (Q8_0), float32 vector (F32/F16).  Each entry equals vec_dot."""
    return _matvec_batch(w, qtype, _lead1(a))[0]


def vec_dot(w_row: np.ndarray, qtype, a) -> np.float32:
    """One weight row (bytes) . one activation row, as ggml_vec_dot_<type>_generic."""
    return np.float32(matvec(np.asarray(w_row, dtype=np.uint8)[None, :], qtype, a)[0])


def matmul(w: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
    """y = x @ W^T as the CPU backend computes it: each activation row is first quantized to
    the weight's vec_dot_type, then every output is one vec_dot.  w (rows, row_bytes) uint8,
    x float32 (n, k) -> float32 (n, rows).  F32/F16 weights: float32 products accumulated in
    float64 in element order, then rounded to float32 (ggml's scalar ggml_vec_dot_f32/_f16)."""
    if np.asarray(w).dtype != np.uint8:
        raise TypeError(f"weights must be raw uint8 bytes (rows, row_bytes), got {np.asarray(w).dtype}")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError("x must be (n, k)")
    return _matvec_batch(w, qtype, quantize_activation(x, qtype))
