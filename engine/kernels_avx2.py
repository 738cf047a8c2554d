"""The k-quant products with AVX2's byte multiply-add (`vpmaddubsw`), which numba's code
generation never picks: the same integers as engine/kernels.py's portable lane loop,
formed 32 products per instruction instead of 8.

ggml's generic dot product keeps 8 int32 lane sums per super-block (lane l = value
position mod 8, `aux32[l]`) and does its float work per lane, so the lanes must stay
apart. `vpmaddubsw` adds ADJACENT byte products, which in ggml's value order belong to
neighbouring lanes. So both operands are put in lane-major order first, the same fixed
permutation of every 32 values: value 8M + l (M = 0..3) goes to byte 4l + M. Then one
`vpmaddubsw` gives, per lane, two sums of two products, and one `vpmaddwd` with the
sub-block scales gives each lane's scaled sum as an int32 -- exactly aux32[l]'s share of
those 32 values. Q4_K/Q5_K have one scale per 32 values; Q6_K has one per 16, which in
lane-major order are M = 0, 1 and M = 2, 3: the scale pair (sc[2t], sc[2t + 1]) goes in
as the two words `vpmaddwd` multiplies.

Exactness: `vpmaddubsw` saturates at int16, so every pair sum must fit: Q4_K/Q5_K quants
are <= 31 (2 * 31 * 128 = 7936); Q6_K quants go in unsigned (q + 32 <= 63, 2 * 63 * 128 =
16128) and 32 * (y0 + y1) of the same pair is subtracted after (the true pair sum is at
most 2 * 32 * 128 = 8192 in magnitude, so the int16 difference is exact). Integer sums are
exact in any order, so aux32[l] is the integer the portable kernel forms, and the float
work after it is the portable kernel's, per lane, in ggml's order: the logits do not
change by a bit.

The activations (Q8_K quants) are permuted once per call; each weight super-block is
unpacked into lane-major bytes once and used by every activation row (prefill's
micro-batch shares the unpacking). Compiled only when chosen (engine/kernels.py's
kernel path): on a CPU without AVX2 these instructions do not exist.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .kernel_parts import (LANES, ROWS_PER_ITEM, U, f16, kquant_block_bytes, mins_term, most_rows, sum_lanes,
                           take_item, u8_pointer)
from .qtypes import Q4_K, Q6_K, QK_K

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_V32I8 = ir.VectorType(_I8, 32)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
# byte 4l + M of a lane-major chunk is value 8M + l of ggml's order
_LANE_MAJOR = ir.Constant(ir.VectorType(_I32, 32), [8 * (j % 4) + j // 4 for j in range(32)])


def _splat(ty, v):
    return ir.Constant(ty, [v] * ty.count)


def _at(context, builder, aryty, ary, offset, vecty):
    """Pointer to a vector of type vecty at element `offset` of a 1-D array."""
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [offset]), vecty.as_pointer())


def _load(builder, ptr):
    return builder.load(ptr, align=1)


def _store(builder, v, ptr):
    builder.store(v, ptr).align = 1


def _lane_major(builder, v):
    return builder.shuffle_vector(v, ir.Constant(_V32I8, None), _LANE_MAJOR)


def _x86(builder, name, ret, *args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _is_u8_array(t):
    return isinstance(t, types.Array) and t.ndim == 1 and t.dtype in (types.uint8, types.int8)


@intrinsic
def _unpack_q4_K(typingctx, wr, o, u):
    """The 256 quants of the Q4_K super-block at byte o of row wr -> u (uint8[256]) in
    lane-major order, 64 values per 32 packed bytes (low nibbles, then high)."""
    if not (_is_u8_array(wr) and _is_u8_array(u) and isinstance(o, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        w, off, out = args
        off = context.cast(builder, off, sig.args[1], types.intp)
        for c in range(4):
            src = _at(context, builder, sig.args[0], w, builder.add(off, ir.Constant(off.type, 16 + 32 * c)), _V32I8)
            b = _lane_major(builder, _load(builder, src))
            lo = builder.and_(b, _splat(_V32I8, 0x0F))
            hi = builder.lshr(b, _splat(_V32I8, 4))
            _store(builder, lo, _at(context, builder, sig.args[2], out, ir.Constant(off.type, 64 * c), _V32I8))
            _store(builder, hi, _at(context, builder, sig.args[2], out, ir.Constant(off.type, 64 * c + 32), _V32I8))
        return context.get_dummy_value()
    return types.none(wr, o, u), codegen


@intrinsic
def _unpack_q5_K(typingctx, wr, o, u):
    """As _unpack_q4_K for Q5_K: the fifth bit of value 64c + x (low nibble) is bit 2c of
    qh[x], of value 64c + 32 + x (high nibble) bit 2c + 1."""
    if not (_is_u8_array(wr) and _is_u8_array(u) and isinstance(o, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        w, off, out = args
        off = context.cast(builder, off, sig.args[1], types.intp)
        at = lambda d: _at(context, builder, sig.args[0], w, builder.add(off, ir.Constant(off.type, d)), _V32I8)
        qh = _lane_major(builder, _load(builder, at(16)))
        zero = _splat(_V32I8, 0)
        for c in range(4):
            b = _lane_major(builder, _load(builder, at(48 + 32 * c)))
            for half, q in ((0, builder.and_(b, _splat(_V32I8, 0x0F))), (1, builder.lshr(b, _splat(_V32I8, 4)))):
                bit = builder.and_(qh, _splat(_V32I8, 1 << (2 * c + half)))
                fifth = builder.select(builder.icmp_unsigned("!=", bit, zero), _splat(_V32I8, 16), zero)
                _store(builder, builder.or_(q, fifth),
                       _at(context, builder, sig.args[2], out, ir.Constant(off.type, 64 * c + 32 * half), _V32I8))
        return context.get_dummy_value()
    return types.none(wr, o, u), codegen


@intrinsic
def _unpack_q6_K(typingctx, wr, o, u):
    """The 256 quants of the Q6_K super-block at byte o of row wr, UNSIGNED (q + 32, 0..63)
    -> u (uint8[256]) in lane-major order: in half h, bytes x of ql (ql[64h + x] = a,
    ql[64h + 32 + x] = b) and qh[32h + x] make values 128h + 32t + x, t = 0..3, as
    (a|b low/high nibble) | (2 bits of qh << 4)."""
    if not (_is_u8_array(wr) and _is_u8_array(u) and isinstance(o, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        w, off, out = args
        off = context.cast(builder, off, sig.args[1], types.intp)
        at = lambda d: _at(context, builder, sig.args[0], w, builder.add(off, ir.Constant(off.type, d)), _V32I8)
        low4, two = _splat(_V32I8, 0x0F), _splat(_V32I8, 0x30)
        for h in range(2):
            a = _lane_major(builder, _load(builder, at(64 * h)))
            b = _lane_major(builder, _load(builder, at(64 * h + 32)))
            qh = _lane_major(builder, _load(builder, at(128 + 32 * h)))
            parts = (
                (builder.and_(a, low4), builder.and_(builder.shl(qh, _splat(_V32I8, 4)), two)),
                (builder.and_(b, low4), builder.and_(builder.shl(qh, _splat(_V32I8, 2)), two)),
                (builder.lshr(a, _splat(_V32I8, 4)), builder.and_(qh, two)),
                (builder.lshr(b, _splat(_V32I8, 4)), builder.and_(builder.lshr(qh, _splat(_V32I8, 2)), two)),
            )
            for t, (q, hi) in enumerate(parts):
                _store(builder, builder.or_(q, hi),
                       _at(context, builder, sig.args[2], out, ir.Constant(off.type, 128 * h + 32 * t), _V32I8))
        return context.get_dummy_value()
    return types.none(wr, o, u), codegen


def _dot_lanes_intrinsic(offsets: bool):
    """An intrinsic (u, y, yo, [yoff, yoffo,] scw, aux): aux[l] = the sum over the
    super-block's 8 chunks t of vpmaddwd(vpmaddubsw(u[32t:], y[yo + 32t:]) [- yoff[yoffo +
    16t:]], scw[t] as two int16) -- each lane's scaled integer sum. u: lane-major unsigned
    quants; y: lane-major int8 activations; yoff: the int16 pair offsets Q6_K subtracts."""
    def codegen(context, builder, sig, args):
        arg = lambda i: (sig.args[i], args[i])
        ptr = lambda i, k, ty: _at(context, builder, *arg(i), k, ty)
        yo = context.cast(builder, args[2], sig.args[2], types.intp)
        if offsets:
            oo = context.cast(builder, args[4], sig.args[4], types.intp)
        scales = context.make_array(sig.args[-2])(context, builder, args[-2]).data
        acc = _splat(_V8I32, 0)
        for t in range(8):
            k = ir.Constant(yo.type, 32 * t)
            p = _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, _load(builder, ptr(0, k, _V32I8)),
                     _load(builder, ptr(1, builder.add(yo, k), _V32I8)))
            if offsets:
                p = builder.sub(p, _load(builder, ptr(3, builder.add(oo, ir.Constant(oo.type, 16 * t)), _V16I16)))
            sc = builder.load(builder.gep(scales, [ir.Constant(_I32, t)]))
            scv = builder.insert_element(ir.Constant(_V8I32, None), sc, ir.Constant(_I32, 0))
            scv = builder.shuffle_vector(scv, ir.Constant(_V8I32, None), ir.Constant(_V8I32, [0] * 8))
            acc = builder.add(acc, _x86(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, p, builder.bitcast(scv, _V16I16)))
        _store(builder, acc, ptr(len(args) - 1, ir.Constant(yo.type, 0), _V8I32))
        return context.get_dummy_value()

    def typed(a):
        ints = a[2:3] + (a[4:5] if offsets else ())
        arrays = zip(a[-2:] + a[3:4] * offsets, (types.int32, types.int32, types.int16))
        if not (_is_u8_array(a[0]) and _is_u8_array(a[1]) and all(isinstance(t, types.Integer) for t in ints)
                and all(isinstance(t, types.Array) and t.dtype == dt for t, dt in arrays)):
            return None
        return types.none(*a), codegen

    if offsets:
        return intrinsic(lambda typingctx, u, y, yo, yoff, yoffo, scw, aux: typed((u, y, yo, yoff, yoffo, scw, aux)))
    return intrinsic(lambda typingctx, u, y, yo, scw, aux: typed((u, y, yo, scw, aux)))


_dot_lanes = _dot_lanes_intrinsic(offsets=False)
_dot_lanes_q6 = _dot_lanes_intrinsic(offsets=True)


@njit(cache=True)
def lane_major_activations(qs):
    """Q8_K quants int8[n, k] -> (the same in lane-major order per 32 values, the int16
    pair offsets 32 * (y[2w] + y[2w + 1]) of that order that Q6_K's unsigned quants need)."""
    n, k = qs.shape
    yl = np.empty((n, k), np.int8)
    yoff = np.empty((n, k // 2), np.int16)
    for r in range(n):
        for c in range(k // 32):
            for j in range(32):
                yl[r, 32 * c + j] = qs[r, 32 * c + 8 * (j % 4) + j // 4]
        for w in range(k // 2):
            yoff[r, w] = 32 * (np.int16(yl[r, 2 * w]) + np.int16(yl[r, 2 * w + 1]))
    return yl, yoff


@intrinsic
def _load_u32(typingctx, ary, off):
    """The 4 bytes at ary[off:off + 4] as a little-endian uint32 (unaligned)."""
    if not (_is_u8_array(ary) and isinstance(off, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        off = context.cast(builder, args[1], sig.args[1], types.intp)
        return builder.load(_at(context, builder, sig.args[0], args[0], off, _I32), align=1)
    return types.uint32(ary, off), codegen


@njit(cache=True, inline="always")
def _scales_mins_k4_words(wr, off, scm, scw):
    """The 8 6-bit scales and mins of a Q4_K/Q5_K super-block (get_scale_min_k4 of all 8 at
    once, four per uint32): the mins to scm[8:16], the scales as vpmaddwd's word pairs
    (sc[t], sc[t]) to scw."""
    a0 = _load_u32(wr, off)
    a1 = _load_u32(wr, off + 4)
    a2 = _load_u32(wr, off + 8)
    sc_lo = a0 & 0x3F3F3F3F
    sc_hi = (a2 & 0x0F0F0F0F) | (((a0 >> 6) & 0x03030303) << 4)
    mn_lo = a1 & 0x3F3F3F3F
    mn_hi = ((a2 >> 4) & 0x0F0F0F0F) | (((a1 >> 6) & 0x03030303) << 4)
    for t in range(4):
        lo = np.int32((sc_lo >> (8 * t)) & 0xFF)
        hi = np.int32((sc_hi >> (8 * t)) & 0xFF)
        scw[t] = lo | (lo << 16)
        scw[4 + t] = hi | (hi << 16)
        scm[8 + t] = np.int32((mn_lo >> (8 * t)) & 0xFF)
        scm[12 + t] = np.int32((mn_hi >> (8 * t)) & 0xFF)


@intrinsic
def _q6_scale_words(typingctx, wr, off, scw):
    """The 16 int8 scales of a Q6_K super-block at wr[off:] as int16: scw[t] holds (sc[2t],
    sc[2t + 1]), the two words vpmaddwd applies to chunk t's lane pair sums."""
    if not (_is_u8_array(wr) and isinstance(off, types.Integer)
            and isinstance(scw, types.Array) and scw.dtype == types.int32):
        return None

    def codegen(context, builder, sig, args):
        off = context.cast(builder, args[1], sig.args[1], types.intp)
        v16i8 = ir.VectorType(_I8, 16)
        sc = builder.sext(_load(builder, _at(context, builder, sig.args[0], args[0], off, v16i8)), _V16I16)
        _store(builder, sc, _at(context, builder, sig.args[2], args[2], ir.Constant(off.type, 0), _V16I16))
        return context.get_dummy_value()
    return types.none(wr, off, scw), codegen


@njit(cache=True, parallel=True)
def matmul_kquant(ptrs, n_rows, row_bytes, qtype, d, qs, bsums, act_rows, act_start, lanes, workers):
    """engine/kernels.matmul_kquant's contract and bits, the integer lane sums by
    vpmaddubsw over lane-major bytes (see above)."""
    n_mat = ptrs.shape[0]
    bb = kquant_block_bytes(qtype, row_bytes, d, qs, bsums, act_rows, act_start, lanes, n_mat)
    nb = qs.shape[1] // QK_K
    yl, yoff = lane_major_activations(qs)
    out = np.empty((act_rows.shape[0], n_rows), np.float32)
    per = (n_rows + ROWS_PER_ITEM - 1) // ROWS_PER_ITEM
    most = most_rows(act_start)
    taken = np.zeros(1, np.int64)
    for _ in prange(workers):
        sums = np.empty((most, LANES), np.float32)   # C: sums[8] of each output
        sumf = np.empty(most, np.float32)             # C: sumf
        scm = np.empty(16, np.int32)                  # one super-block's scales (and mins)
        scw = np.empty(8, np.int32)                   # the scales as vpmaddwd's word pairs
        aux = np.empty(LANES, np.int32)              # C: aux32
        u = np.empty(QK_K, np.uint8)                  # one super-block's quants, lane-major
        while True:
            m, a0, a1, r0 = take_item(taken, n_mat, per, act_start)
            if m < 0:
                break
            cnt = a1 - a0
            w = numba.carray(u8_pointer(ptrs[m]), (n_rows, row_bytes))
            for r in range(r0, min(n_rows, r0 + ROWS_PER_ITEM)):
                wr = w[r]
                sums[:cnt] = 0
                sumf[:cnt] = 0
                for i in range(nb):
                    o = i * bb
                    if qtype == Q6_K:
                        xd = f16(wr[o + 208], wr[o + 209])
                        _q6_scale_words(wr, o + 192, scw)
                        _unpack_q6_K(wr, o, u)
                    else:
                        xd = f16(wr[o], wr[o + 1])
                        xm = f16(wr[o + 2], wr[o + 3])
                        _scales_mins_k4_words(wr, o + 4, scm, scw)
                        if qtype == Q4_K:
                            _unpack_q4_K(wr, o, u)
                        else:
                            _unpack_q5_K(wr, o, u)
                    for s in range(cnt):
                        j = act_rows[a0 + s]
                        if qtype == Q6_K:
                            _dot_lanes_q6(u, yl[j], i * QK_K, yoff[j], i * (QK_K // 2), scw, aux)
                        else:
                            _dot_lanes(u, yl[j], i * QK_K, scw, aux)
                        dd = np.float32(xd * d[j, i])
                        for l in range(lanes):
                            sums[s, U(l)] = np.float32(sums[s, U(l)] + np.float32(dd * np.float32(aux[U(l)])))
                        if qtype != Q6_K:
                            mins_term(xm, d[j, i], bsums[j], i, scm, sumf, s)
                sum_lanes(sums, sumf, cnt, out, a0, r)
    return out
