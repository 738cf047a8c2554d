"""The k-quant products with x86's byte multiply-add (`vpmaddubsw`), which numba's code
generation never picks: the same integers as engine/kernels.py's portable lane loop,
formed 32 products per instruction (AVX2, 256-bit vectors) or 64 (AVX-512BW, 512-bit)
instead of 8.

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

With 512-bit vectors each holds two chunks of 32 (CHUNK_GROUPS: the two halves of one
64-byte load), the activations are laid out in the same chunk order, and the two halves'
lane sums are added lane by lane: the same aux32[l].

The activations (Q8_K quants) are permuted once per call. Each product is one intrinsic
per weight row, everything in registers: with one activation row (decode) the whole dot
product, with several (prefill) each super-block is unpacked once and used by all of them.
Q8_0 (attention's key projection) is here too: its signed products by the sign trick
(_rows_dot_q8_0), on 256-bit vectors for both paths. Compiled only when chosen
(engine/kernels.py's kernel path), each width on its own: on a CPU without the extension
its instructions do not exist.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .kernel_parts import (LANES, PARALLEL_ROWS, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_0_BYTES, ROWS_PER_ITEM, check_f32,
                           check_q8_0, kquant_block_bytes, take_item, u8_pointer, work_counters)
from .qtypes import Q4_K, Q5_K, Q6_K, QK_K

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F32 = ir.FloatType()
_V32I8 = ir.VectorType(_I8, 32)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V8F32 = ir.VectorType(_F32, 8)
_BLOCK_BYTES = {Q4_K: Q4_K_BYTES, Q5_K: Q5_K_BYTES, Q6_K: Q6_K_BYTES}


# ----------------------------------------------------------------- IR pieces

def _splat(ty, v):
    return ir.Constant(ty, [v] * ty.count)


def _idx(*v):
    return ir.Constant(ir.VectorType(_I32, len(v)), list(v))


def _data(context, builder, aryty, ary):
    """An array's data as i8*."""
    return builder.bitcast(context.make_array(aryty)(context, builder, ary).data, _I8.as_pointer())


def _row(context, builder, aryty, ary, jty, j):
    """Row j of a C-contiguous 2-D array as i8* (no view: a view in a hot loop costs an
    atomic reference count on the array, which two threads then fight over)."""
    a = context.make_array(aryty)(context, builder, ary)
    stride = cgutils.unpack_tuple(builder, a.strides, 2)[0]
    j = context.cast(builder, j, jty, types.intp)
    return builder.gep(builder.bitcast(a.data, _I8.as_pointer()), [builder.mul(j, stride)])


def _load(builder, base, byte_offset, ty):
    """The value of type ty at base + byte_offset (i8* base; unaligned)."""
    off = byte_offset if isinstance(byte_offset, ir.Value) else ir.Constant(ir.IntType(64), byte_offset)
    return builder.load(builder.bitcast(builder.gep(base, [off]), ty.as_pointer()), align=1)


def _x86(builder, name, ret, *args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


# How far ahead of the block being multiplied its weight row's stream is prefetched.
# A decode product is bound by how fast one core streams the weights from memory (a Q4_K
# product runs no faster with its integer work removed), and the hardware prefetcher alone
# kept too few lines in flight: 8 KiB ahead made the Q4_K product ~15 % faster.
PREFETCH_AHEAD = 8192


def _prefetch(builder, base, nbytes):
    """Prefetch the cache lines of base + PREFETCH_AHEAD .. + nbytes (a hint: it never
    faults, past the end of a matrix included, and changes no result)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32]),
                                        "llvm.prefetch.p0")
    for off in range(0, nbytes, 64):
        at = builder.gep(base, [ir.Constant(ir.IntType(64), PREFETCH_AHEAD + off)])
        builder.call(fn, [at, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _f16s(builder, blk, off, n):
    """The n consecutive f16 at blk + off as float32 values, exactly as kernel_parts.f16 (a
    NaN is the quiet NaN 0x7FC00000 with the f16's sign, whatever its payload); converted
    together (a super-block's d and dmin are adjacent)."""
    b = builder
    vi16, vi32, vf32 = ir.VectorType(_I16, n), ir.VectorType(_I32, n), ir.VectorType(_F32, n)
    h = _load(b, blk, off, vi16)
    f = b.fpext(b.bitcast(h, ir.VectorType(ir.HalfType(), n)), vf32)
    sign = b.shl(b.zext(b.and_(h, _splat(vi16, 0x8000)), vi32), _splat(vi32, 16))
    nan = b.bitcast(b.or_(sign, _splat(vi32, 0x7FC00000)), vf32)
    f = b.select(b.fcmp_unordered("uno", f, f), nan, f)
    return [b.extract_element(f, ir.Constant(_I32, i)) for i in range(n)]


def _block_scales(builder, qtype, blk):
    """A super-block's (d, dmin) as float32; dmin None for Q6_K."""
    if qtype == Q6_K:
        return _f16s(builder, blk, 208, 1)[0], None
    return tuple(_f16s(builder, blk, 0, 2))


def _cat(builder, vs):
    """Vectors of one type, concatenated (a single one as it is)."""
    while len(vs) > 1:
        n = vs[0].type.count
        vs = [builder.shuffle_vector(vs[i], vs[i + 1], _idx(*range(2 * n))) for i in range(0, len(vs), 2)]
    return vs[0]


def _lane_major(builder, blk, offs):
    """The 32 bytes at blk + o for each o in offs, concatenated, each 32 in lane-major order
    (one 64-byte load and one byte permutation when the offsets are adjacent)."""
    v = _cat(builder, [_load(builder, blk, o, _V32I8) for o in offs])
    order = [32 * (j // 32) + 8 * (j % 4) + j % 32 // 4 for j in range(v.type.count)]
    return builder.shuffle_vector(v, ir.Constant(v.type, None), _idx(*order))


# The chunks of 32 values (T = 0..7: values 32T..32T + 31) that one vector holds, in the
# order the vectors are formed: one chunk per 256-bit vector; two per 512-bit vector, paired
# so that both halves come from one 64-byte load with the same nibble. The activations are
# laid out in the same order (CHUNK_ORDER; the kernel's `order`).
CHUNK_GROUPS = {(q, False): tuple((t,) for t in range(8)) for q in (Q4_K, Q5_K, Q6_K)}
CHUNK_GROUPS.update({(Q4_K, True): ((0, 2), (1, 3), (4, 6), (5, 7)), (Q5_K, True): ((0, 2), (1, 3), (4, 6), (5, 7)),
                     (Q6_K, True): ((0, 1), (2, 3), (4, 5), (6, 7))})
CHUNK_ORDER = {key: tuple(t for g in groups for t in g) for key, groups in CHUNK_GROUPS.items()}
_WIDE_Q45_ORDER = CHUNK_ORDER[Q4_K, True]   # every other (type, width) is in value order
assert {k: v for k, v in CHUNK_ORDER.items() if v != tuple(range(8))} == {(Q4_K, True): _WIDE_Q45_ORDER,
                                                                           (Q5_K, True): _WIDE_Q45_ORDER}


def _quant_chunks(builder, qtype, blk, wide):
    """A super-block's 256 quants as lane-major unsigned bytes (Q4_K 0..15, Q5_K 0..31, Q6_K
    q + 32 = 0..63), one vector per group of CHUNK_GROUPS[qtype, wide]. Chunk T of Q4_K/Q5_K
    is the low (T even) or high nibble of packed bytes 32 * (T // 2) ..; Q5_K's fifth bit is
    bit T of qh. Q6_K, half h = T // 4, t = T % 4: nibble t // 2 of ql[64h + 32 (t % 2) ..],
    the high two bits from qh[32h ..] shifted by 4, 2, 0, -2 for t = 0..3."""
    b = builder
    out = []
    for g in CHUNK_GROUPS[qtype, wide]:
        n = 32 * len(g)
        vt = ir.VectorType(_I8, n)
        if qtype == Q6_K:
            q = _lane_major(b, blk, [64 * (t // 4) + 32 * (t % 2) for t in g])
            nib = b.lshr(q, _splat(vt, 4)) if g[0] % 4 >= 2 else b.and_(q, _splat(vt, 0x0F))
            highs = []
            for t in g:
                qh = _lane_major(b, blk, [128 + 32 * (t // 4)])
                sh = (4, 2, 0, -2)[t % 4]
                qh = b.shl(qh, _splat(_V32I8, sh)) if sh > 0 else b.lshr(qh, _splat(_V32I8, -sh)) if sh < 0 else qh
                highs.append(b.and_(qh, _splat(_V32I8, 0x30)))
            out.append(b.or_(nib, _cat(b, highs)))
            continue
        q = _lane_major(b, blk, [(16 if qtype == Q4_K else 48) + 32 * (t // 2) for t in g])
        nib = b.lshr(q, _splat(vt, 4)) if g[0] % 2 else b.and_(q, _splat(vt, 0x0F))
        if qtype == Q5_K:
            bit = b.and_(_lane_major(b, blk, [16] * len(g)), ir.Constant(vt, [1 << t for t in g for _ in range(32)]))
            nib = b.or_(nib, b.select(b.icmp_unsigned("!=", bit, _splat(vt, 0)), _splat(vt, 16), _splat(vt, 0)))
        out.append(nib)
    return out


def _scales_mins_k4(builder, blk):
    """get_scale_min_k4 of all 8 sub-blocks of a Q4_K/Q5_K super-block at once, four per
    uint32: (scales, mins) as <8 x i8>."""
    b = builder
    a0, a1, a2 = (_load(b, blk, d, _I32) for d in (4, 8, 12))
    c = lambda v: ir.Constant(_I32, v)
    top2 = lambda v: b.shl(b.and_(b.lshr(v, c(6)), c(0x03030303)), c(4))
    sc = (b.and_(a0, c(0x3F3F3F3F)), b.or_(b.and_(a2, c(0x0F0F0F0F)), top2(a0)))
    mn = (b.and_(a1, c(0x3F3F3F3F)), b.or_(b.and_(b.lshr(a2, c(4)), c(0x0F0F0F0F)), top2(a1)))

    def bytes8(lo, hi):
        v = b.insert_element(ir.Constant(ir.VectorType(_I32, 2), None), lo, c(0))
        return b.bitcast(b.insert_element(v, hi, c(1)), ir.VectorType(_I8, 8))
    return bytes8(*sc), bytes8(*mn)


def _scale_words(builder, qtype, blk, wide):
    """The int16 words vpmaddwd applies to each chunk vector's lane pair sums (per group of
    CHUNK_GROUPS): for chunk T, (sc[T], sc[T]) for Q4_K/Q5_K (32 values per scale),
    (sc[2T], sc[2T + 1]) for Q6_K (16 per scale); and the mins as words (m[g], m[g]) for the
    bsums pairs (Q4_K/Q5_K; None for Q6_K)."""
    b = builder
    groups = CHUNK_GROUPS[qtype, wide]
    n = 16 * len(groups[0])                 # words per vector
    if qtype == Q6_K:
        sc = b.sext(_load(b, blk, 192, ir.VectorType(_I8, 16)), _V16I16)
        return [b.shuffle_vector(sc, ir.Constant(_V16I16, None), _idx(*[2 * g[j // 16] + j % 2 for j in range(n)]))
                for g in groups], None
    sc8, mn8 = _scales_mins_k4(b, blk)
    # the 8 bytes in every quadword, then per word vector one in-lane byte shuffle (vpshufb):
    # word j = byte at(j) zero-extended (the zero from the second source), at(j) in j's lane
    i64 = ir.IntType(64)

    def quads(v, count):
        q = b.shuffle_vector(b.bitcast(v, ir.VectorType(i64, 1)), ir.Constant(ir.VectorType(i64, 1), None),
                             _idx(*[0] * count))
        return b.bitcast(q, ir.VectorType(_I8, 8 * count))

    def words(v, at, count):
        zero = _splat(v.type, 0)
        return b.bitcast(b.shuffle_vector(v, zero, _idx(*[x for j in range(count) for x in (at(j) + 16 * (j // 8),
                                                                                          v.type.count)])),
                         ir.VectorType(_I16, count))
    sc = quads(sc8, n // 4)
    return ([words(sc, lambda j, g=g: g[j // 16], n) for g in groups],
            words(quads(mn8, 4), lambda j: j // 2, 16))


def _lane_sums(builder, qtype, chunks, words, y, yo, yoff, oo, wide):
    """aux32 of ggml's generic dot product as <8 x i32> (lane l = element l): each chunk
    vector's vpmaddubsw with the activations at y[yo + its offset] (laid out in the same
    chunk order; Q6_K: less the pair offsets at yoff[oo + ...]), then vpmaddwd with its
    scale words, summed; a 512-bit sum's two halves (chunks) added lane by lane."""
    b = builder
    nb = 64 if wide else 32
    vb, vw, vd = ir.VectorType(_I8, nb), ir.VectorType(_I16, nb // 2), ir.VectorType(_I32, nb // 4)
    madd_bytes, madd_words = (("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512") if wide else
                              ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"))
    acc = _splat(vd, 0)
    for k, chunk in enumerate(chunks):
        p = _x86(b, madd_bytes, vw, chunk, _load(b, y, b.add(yo, ir.Constant(yo.type, nb * k)), vb))
        if qtype == Q6_K:
            p = b.sub(p, _load(b, yoff, b.add(oo, ir.Constant(oo.type, nb * k)), vw))
        acc = b.add(acc, _x86(b, madd_words, vd, p, words[k]))
    if wide:
        acc = b.add(b.shuffle_vector(acc, acc, _idx(*range(8))), b.shuffle_vector(acc, acc, _idx(*range(8, 16))))
    return acc


def _hsum(builder, v):
    """The sum of an integer vector's elements (exact: any order)."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, _idx(*range(n)))
        hi = builder.shuffle_vector(v, v, _idx(*range(n, 2 * n)))
        v = builder.add(lo, hi)
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _is_bytes(t):
    return isinstance(t, types.Array) and t.ndim == 1 and t.dtype in (types.uint8, types.int8)


def _is_array(t, dtype, ndim=1):
    return isinstance(t, types.Array) and t.ndim == ndim and t.dtype == dtype and (ndim == 1 or t.layout == "C")


# ----------------------------------------------------------------- intrinsics

def _is_width(t):
    """The vector width argument: a compile-time 0 (256 bits) or 1 (512 bits)."""
    return isinstance(t, types.IntegerLiteral) and t.literal_value in (0, 1)


def _rows_dot_intrinsic(qtype):
    """(wr, nb, y, yd, extra, act_rows, at, count, out, r, wide, ydt, minst, g): one weight row
    of nb super-blocks times the `count` activation rows act_rows[at:at + count], ggml's
    generic dot product whole for each, written to out[at + s, r]. Each super-block is
    unpacked once, into registers, for all of them, and each row's C state (sums[8], sumf)
    stays in registers; count (1..ROWS_AT_ONCE) and wide (1: 512-bit vectors) are literals,
    so each is its own code. y: lane-major quants in CHUNK_ORDER[qtype, wide]; yd: the
    activations' d per super-block; extra: their bsums (Q4_K/Q5_K) or the pair offsets of y
    (Q6_K). The float work in C order: per super-block d = f16(x.d) * y.d, sums[l] += d *
    (float)aux32[l], then (Q4_K/Q5_K) sumf -= (f16(x.dmin) * y.d) * (float)sumi; at the end
    sumf += sums[l], l = 0..7.

    With two rows or more, the work each row does once per super-block is done for all of
    them at once, row s in vector lane s (the same operations per row, so the same bits):
    d and dmin from group g's y.d (ydt[g]: 8 per super-block), and sumi as sum_g (bsums[2g]
    + bsums[2g + 1]) * mins[g] by vpmaddwd over group g's pair sums (minst[g]: per
    super-block 4 vectors, each sub-block pair 2t, 2t + 1 of the 8 rows) -- instead of a
    horizontal sum per row."""
    bb = _BLOCK_BYTES[qtype]

    def typer(typingctx, wr, nb, y, yd, extra, act_rows, at, count, out, r, wide, ydt, minst, g):
        if not (_is_bytes(wr) and isinstance(nb, types.Integer) and _is_array(y, types.int8, 2)
                and _is_array(yd, types.float32, 2) and _is_array(extra, types.int16, 2)
                and _is_array(act_rows, types.int64) and isinstance(at, types.Integer)
                and isinstance(count, types.IntegerLiteral) and 1 <= count.literal_value <= ROWS_AT_ONCE
                and _is_array(out, types.float32, 2) and isinstance(r, types.Integer) and _is_width(wide)
                and _is_array(ydt, types.float32, 2) and _is_array(minst, types.int16, 2)
                and isinstance(g, types.Integer)):
            return None
        return types.none(wr, nb, y, yd, extra, act_rows, at, count, out, r, wide, ydt, minst, g), codegen

    def codegen(context, builder, sig, args):
        b = builder
        n_rows, wide = sig.args[7].literal_value, bool(sig.args[10].literal_value)
        i64 = lambda v: ir.Constant(ir.IntType(64), v)
        w, rows = (_data(context, b, sig.args[k], args[k]) for k in (0, 5))
        nb, at, r = (context.cast(b, args[k], sig.args[k], types.int64) for k in (1, 6, 9))
        ys, yds, extras, outs = [], [], [], []
        for s in range(n_rows):
            j = _load(b, rows, b.mul(b.add(at, i64(s)), i64(8)), ir.IntType(64))
            y, yd, extra = (_row(context, b, sig.args[k], args[k], types.int64, j) for k in (2, 3, 4))
            ys.append(y), yds.append(yd), extras.append(extra)
            outs.append(b.gep(_row(context, b, sig.args[8], args[8], types.int64, b.add(at, i64(s))),
                              [b.mul(r, i64(4))]))
        splat8 = lambda v: b.shuffle_vector(b.insert_element(ir.Constant(_V8F32, None), v, ir.Constant(_I32, 0)),
                                            ir.Constant(_V8F32, None), _idx(*[0] * 8))
        across = n_rows > 1   # the rows' per-block scalars as the lanes of one vector
        if across:
            g = context.cast(b, args[13], sig.args[13], types.int64)
            ydt, minst = (_row(context, b, sig.args[k], args[k], types.int64, g) for k in (11, 12))
        sums = [cgutils.alloca_once_value(b, _splat(_V8F32, 0.0)) for _ in range(n_rows)]
        sumf = [cgutils.alloca_once_value(b, ir.Constant(_F32, 0.0)) for _ in range(n_rows)]
        sumf_rows = cgutils.alloca_once_value(b, _splat(_V8F32, 0.0))   # across: row s's sumf in lane s
        with cgutils.for_range(b, nb) as loop:
            i = loop.index
            blk = b.gep(w, [b.mul(i, i64(bb))])
            _prefetch(b, blk, bb)
            words, mins = _scale_words(b, qtype, blk, wide)
            chunks = _quant_chunks(b, qtype, blk, wide)
            xd, xm = _block_scales(b, qtype, blk)
            yo = b.mul(i, i64(QK_K))
            if across:
                yd_rows = _load(b, ydt, b.mul(i, i64(4 * 8)), _V8F32)
                d_rows = b.fmul(splat8(xd), yd_rows)
            for s in range(n_rows):
                acc = _lane_sums(b, qtype, chunks, words, ys[s], yo, extras[s], yo, wide)
                if across:
                    dv = b.shuffle_vector(d_rows, ir.Constant(_V8F32, None), _idx(*[s] * 8))
                else:
                    ydi = _load(b, yds[s], b.mul(i, i64(4)), _F32)
                    dv = splat8(b.fmul(xd, ydi))
                b.store(b.fadd(b.load(sums[s]), b.fmul(dv, b.sitofp(acc, _V8F32))), sums[s])
                if mins is not None and not across:
                    bs = _load(b, extras[s], b.mul(i, i64(32)), _V16I16)
                    sumi = _hsum(b, _x86(b, "llvm.x86.avx2.pmadd.wd", _V8I32, bs, mins))
                    b.store(b.fsub(b.load(sumf[s]), b.fmul(b.fmul(xm, ydi), b.sitofp(sumi, _F32))), sumf[s])
            if mins is not None and across:
                # mins = (m0, m0, m1, m1, ...): the pair (m[2t], m[2t + 1]) is words 4t and 4t + 2
                sumi = _splat(_V8I32, 0)
                for t in range(4):
                    pairs = _load(b, minst, b.add(b.mul(i, i64(2 * 64)), i64(32 * t)), _V16I16)
                    mw = b.shuffle_vector(mins, ir.Constant(_V16I16, None), _idx(*[4 * t, 4 * t + 2] * 8))
                    sumi = b.add(sumi, _x86(b, "llvm.x86.avx2.pmadd.wd", _V8I32, pairs, mw))
                dmin = b.fmul(splat8(xm), yd_rows)
                b.store(b.fsub(b.load(sumf_rows), b.fmul(dmin, b.sitofp(sumi, _V8F32))), sumf_rows)
        for s in range(n_rows):
            acc = b.extract_element(b.load(sumf_rows), ir.Constant(_I32, s)) if across else b.load(sumf[s])
            v = b.load(sums[s])
            for l in range(LANES):
                acc = b.fadd(acc, b.extract_element(v, ir.Constant(_I32, l)))
            b.store(acc, b.bitcast(outs[s], _F32.as_pointer()))
        return context.get_dummy_value()
    return intrinsic(typer)


# Activation rows one weight row is multiplied with at once (prefill; more are taken in
# groups of this many, the rest as 4, 3, 2, 1): their state and the unpacked super-block
# fit in the registers.
ROWS_AT_ONCE = 8
_rows_dot_q4_K, _rows_dot_q5_K, _rows_dot_q6_K = (_rows_dot_intrinsic(q) for q in (Q4_K, Q5_K, Q6_K))


@njit(inline="always")
def _rows_dot(qtype, wr, nb, yl, d, extra, act_rows, at, count, out, r, wide, rows):
    ydt, minst, g = rows[0], rows[1], rows[2][at]
    if qtype == Q4_K:
        _rows_dot_q4_K(wr, nb, yl, d, extra, act_rows, at, count, out, r, wide, ydt, minst, g)
    elif qtype == Q5_K:
        _rows_dot_q5_K(wr, nb, yl, d, extra, act_rows, at, count, out, r, wide, ydt, minst, g)
    else:
        _rows_dot_q6_K(wr, nb, yl, d, extra, act_rows, at, count, out, r, wide, ydt, minst, g)


@njit(cache=True, inline="always")
def _row_groups(act_start):
    """The groups of activation rows the kernel multiplies a weight row with at once: per
    matrix, ROWS_AT_ONCE at a time, then 4, then the rest (as _matmul_kquant's loop takes
    them): (first position in act_rows, count) per group."""
    n = 0
    for m in range(act_start.shape[0] - 1):
        left = act_start[m + 1] - act_start[m]
        n += left // ROWS_AT_ONCE + (left % ROWS_AT_ONCE >= 4) + (left % ROWS_AT_ONCE % 4 > 0)
    first = np.empty(n, np.int64)
    count = np.empty(n, np.int64)
    k = 0
    for m in range(act_start.shape[0] - 1):
        at, a1 = act_start[m], act_start[m + 1]
        while at < a1:
            c = ROWS_AT_ONCE if a1 - at >= ROWS_AT_ONCE else 4 if a1 - at >= 4 else a1 - at
            first[k] = at
            count[k] = c
            at += c
            k += 1
    return first, count


@njit(cache=True)
def rows_across(qtype, d, bsums, act_rows, act_start, nb):
    """The per-super-block scalars of each group of rows (_row_groups) with two rows or
    more, row s of a group in lane s: (ydt[group, 8i + s] = y.d of super-block i; minst[group,
    64i + 16t + 2s + e] = bsums[4t + 2e] + bsums[4t + 2e + 1] of it (sub-block 2t + e's pair;
    Q4_K/Q5_K); group[p] = the table row of the group starting at position p of act_rows).
    Only groups of two rows or more have a table row, so a decode call (one row per matrix)
    allocates none. Serial: ~0.1 ms for a 128-row prefill's experts, less than a parallel
    kernel's start."""
    first, count = _row_groups(act_start)
    n_across = 0
    for k in range(first.shape[0]):
        n_across += count[k] >= 2
    group = np.zeros(act_rows.shape[0], np.int64)
    ydt = np.zeros((n_across, 8 * nb), np.float32)
    minst = np.zeros((n_across, 64 * nb if qtype != Q6_K else 0), np.int16)
    g = 0
    for k in range(first.shape[0]):
        at, cnt = first[k], count[k]
        if cnt < 2:
            continue
        group[at] = g
        for s in range(cnt):
            j = act_rows[at + s]
            for i in range(nb):
                ydt[g, 8 * i + s] = d[j, i]
                if qtype != Q6_K:
                    for t in range(4):
                        for e in range(2):
                            minst[g, 64 * i + 16 * t + 2 * s + e] = (bsums[j, 16 * i + 4 * t + 2 * e]
                                                                     + bsums[j, 16 * i + 4 * t + 2 * e + 1])
        g += 1
    return ydt, minst, group


# ----------------------------------------------------------------- the kernel

@njit(cache=True, inline="always")
def _lane_major_row(qs, r, offsets, order, yl, yoff):
    k = qs.shape[1]
    for c in range(k // 32):
        src = QK_K * (c // 8) + 32 * order[c % 8]
        for j in range(32):
            yl[r, 32 * c + j] = qs[r, src + 8 * (j % 4) + j // 4]
    if offsets:
        for w in range(k // 2):
            yoff[r, w] = 32 * (np.int16(yl[r, 2 * w]) + np.int16(yl[r, 2 * w + 1]))


@njit(cache=True)
def _lane_major_serial(qs, offsets, order, yl, yoff):
    for r in range(qs.shape[0]):
        _lane_major_row(qs, r, offsets, order, yl, yoff)


@njit(cache=True, parallel=True)
def _lane_major_parallel(qs, offsets, order, yl, yoff):
    for r in prange(qs.shape[0]):
        _lane_major_row(qs, r, offsets, order, yl, yoff)


@njit(cache=True)
def lane_major_activations(qs, offsets, order):
    """Q8_K quants int8[n, k] -> (the same in lane-major order per 32 values, each
    super-block's chunks of 32 in `order` (CHUNK_ORDER), and with `offsets` (Q6_K) the int16
    pair offsets 32 * (y[2w] + y[2w + 1]) of that layout that its unsigned quants need;
    int16[n, 0] otherwise, never read). Rows in parallel from PARALLEL_ROWS on."""
    n, k = qs.shape
    yl = np.empty((n, k), np.int8)
    yoff = np.empty((n, k // 2 if offsets else 0), np.int16)
    if n >= PARALLEL_ROWS:
        _lane_major_parallel(qs, offsets, order, yl, yoff)
    else:
        _lane_major_serial(qs, offsets, order, yl, yoff)
    return yl, yoff


@njit(cache=True, parallel=True)
def _matmul_kquant(ptrs, n_rows, row_bytes, qtype, d, qs, bsums, act_rows, act_start, lanes, workers, wide):
    """engine/kernels.matmul_kquant's contract and bits, the integer lane sums by
    vpmaddubsw over lane-major bytes (see above), on 256-bit vectors or with `wide` 1 on
    512-bit ones (AVX-512BW; each width compiled on its own, only when used). A weight row
    with one activation row (decode) is one fused dot product; with several (prefill),
    each super-block is unpacked once and used by every row."""
    numba.literally(wide)
    n_mat = ptrs.shape[0]
    kquant_block_bytes(qtype, row_bytes, d, qs, bsums, act_rows, act_start, lanes, n_mat)
    nb = qs.shape[1] // QK_K
    order = np.array(_WIDE_Q45_ORDER) if wide and qtype != Q6_K else np.arange(8)   # CHUNK_ORDER
    yl, yoff = lane_major_activations(qs, qtype == Q6_K, order)
    out = np.empty((act_rows.shape[0], n_rows), np.float32)
    extra = yoff if qtype == Q6_K else bsums
    rows = rows_across(qtype, d, bsums, act_rows, act_start, nb)
    per = (n_rows + ROWS_PER_ITEM - 1) // ROWS_PER_ITEM
    taken = work_counters(workers)
    for tid in prange(workers):
        share = 0
        while True:
            m, a0, a1, r0, share = take_item(taken, tid, share, workers, n_mat, per, act_start)
            if m < 0:
                break
            w = numba.carray(u8_pointer(ptrs[m]), (n_rows, row_bytes))
            for r in range(r0, min(n_rows, r0 + ROWS_PER_ITEM)):
                wr = w[r]
                at = a0
                while a1 - at >= ROWS_AT_ONCE:
                    _rows_dot(qtype, wr, nb, yl, d, extra, act_rows, at, ROWS_AT_ONCE, out, r, wide, rows)
                    at += ROWS_AT_ONCE
                if a1 - at >= 4:
                    _rows_dot(qtype, wr, nb, yl, d, extra, act_rows, at, 4, out, r, wide, rows)
                    at += 4
                left = a1 - at   # literal counts: each is its own code
                if left == 3:
                    _rows_dot(qtype, wr, nb, yl, d, extra, act_rows, at, 3, out, r, wide, rows)
                elif left == 2:
                    _rows_dot(qtype, wr, nb, yl, d, extra, act_rows, at, 2, out, r, wide, rows)
                elif left == 1:
                    _rows_dot(qtype, wr, nb, yl, d, extra, act_rows, at, 1, out, r, wide, rows)
    return out


# The two widths as their own entry points: each passes its width as a compile-time constant
# (numba.literally), so calling one compiles only its instructions.
@njit(cache=True)
def matmul_kquant(ptrs, n_rows, row_bytes, qtype, d, qs, bsums, act_rows, act_start, lanes, workers):
    return _matmul_kquant(ptrs, n_rows, row_bytes, qtype, d, qs, bsums, act_rows, act_start, lanes, workers, 0)


@njit(cache=True)
def matmul_kquant_512(ptrs, n_rows, row_bytes, qtype, d, qs, bsums, act_rows, act_start, lanes, workers):
    return _matmul_kquant(ptrs, n_rows, row_bytes, qtype, d, qs, bsums, act_rows, act_start, lanes, workers, 1)


# Q8_0 blocks multiplied per step of the row: their integer sums are formed together and
# reduced into one vector (block b in lane b), their scales converted together.
Q8_0_STEP = 8


@intrinsic
def _rows_dot_q8_0(typingctx, w, r, count, nb, qs, yd, j, out, a):
    """Q8_0 weight rows r..r + count - 1 of w (count a literal 1..Q8_0_ROWS) times activation
    row j (qs int8, yd its f16 scales as float32), to out[a, r + q]:
    ggml_vec_dot_q8_0_q8_0_generic, sumf += (float)sumi * (x.d * y.d) per block in order.
    sumi by vpmaddubsw(|w|, y with w's sign) and vpmaddwd: exact because the activations'
    quants are in [-127, 127] (quantize_q8_0: |x| * 127 / amax rounds to at most 127), so
    negating one never overflows and a pair is at most 2 * 128 * 127. Q8_0_STEP blocks at a
    time: their sums reduced by vphaddd into one vector (lane b = block b), the scales
    converted and multiplied as vectors, then added to sumf block by block in order (the
    same operations per block as one at a time, which the remainder does). The weight rows'
    chains of additions are independent, so together they hide each other's latency."""
    if not (_is_array(w, types.uint8, 2) and isinstance(r, types.Integer)
            and isinstance(count, types.IntegerLiteral) and 1 <= count.literal_value <= Q8_0_ROWS
            and isinstance(nb, types.Integer) and _is_array(qs, types.int8, 2)
            and _is_array(yd, types.float32, 2) and isinstance(j, types.Integer)
            and _is_array(out, types.float32, 2) and isinstance(a, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        b = builder
        rows = sig.args[2].literal_value
        i64 = lambda v: ir.Constant(ir.IntType(64), v)
        r, n, a = (context.cast(b, args[k], sig.args[k], types.int64) for k in (1, 3, 8))
        ws = [_row(context, b, sig.args[0], args[0], types.int64, b.add(r, i64(q))) for q in range(rows)]
        y, ydj = (_row(context, b, sig.args[k], args[k], sig.args[6], args[6]) for k in (4, 5))
        sumf = [cgutils.alloca_once_value(b, ir.Constant(_F32, 0.0)) for _ in range(rows)]

        def block_sums(w, i):
            """Block i's 8 int32 partial sums (their total is sumi)."""
            blk = b.gep(w, [b.mul(i, i64(Q8_0_BYTES))])
            q = _load(b, blk, 2, _V32I8)
            yq = _load(b, y, b.mul(i, i64(32)), _V32I8)
            p = _x86(b, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, _x86(b, "llvm.x86.avx2.pabs.b", _V32I8, q),
                     _x86(b, "llvm.x86.avx2.psign.b", _V32I8, yq, q))
            return blk, _x86(b, "llvm.x86.avx2.pmadd.wd", _V8I32, p, _splat(_V16I16, 1))

        hadd = lambda x, z: _x86(b, "llvm.x86.avx2.phadd.d", _V8I32, x, z)
        steps = b.udiv(n, i64(Q8_0_STEP))
        with cgutils.for_range(b, steps) as loop:
            i0 = b.mul(loop.index, i64(Q8_0_STEP))
            ydv = _load(b, ydj, b.mul(i0, i64(4)), _V8F32)
            for q in range(rows):
                blks, v = zip(*(block_sums(ws[q], b.add(i0, i64(k))) for k in range(Q8_0_STEP)))
                _prefetch(b, blks[0], Q8_0_STEP * Q8_0_BYTES)
                g1 = hadd(hadd(v[0], v[1]), hadd(v[2], v[3]))   # per 128-bit half: blocks 0-3's partial sums
                g2 = hadd(hadd(v[4], v[5]), hadd(v[6], v[7]))
                sumi = b.add(b.shuffle_vector(g1, g2, _idx(0, 1, 2, 3, 8, 9, 10, 11)),
                             b.shuffle_vector(g1, g2, _idx(4, 5, 6, 7, 12, 13, 14, 15)))
                xd = ir.Constant(_V8F32, None)
                for k in range(Q8_0_STEP):
                    xd = b.insert_element(xd, _f16s(b, blks[k], 0, 1)[0], ir.Constant(_I32, k))
                prod = b.fmul(b.sitofp(sumi, _V8F32), b.fmul(xd, ydv))
                acc = b.load(sumf[q])
                for k in range(Q8_0_STEP):
                    acc = b.fadd(acc, b.extract_element(prod, ir.Constant(_I32, k)))
                b.store(acc, sumf[q])
        with cgutils.for_range_slice(b, b.mul(steps, i64(Q8_0_STEP)), n, i64(1)) as (i, _):
            for q in range(rows):
                blk, v = block_sums(ws[q], i)
                dd = b.fmul(_f16s(b, blk, 0, 1)[0], _load(b, ydj, b.mul(i, i64(4)), _F32))
                b.store(b.fadd(b.load(sumf[q]), b.fmul(b.sitofp(_hsum(b, v), _F32), dd)), sumf[q])
        orow = _row(context, b, sig.args[7], args[7], types.int64, a)
        for q in range(rows):
            b.store(b.load(sumf[q]), b.bitcast(b.gep(orow, [b.mul(b.add(r, i64(q)), i64(4))]), _F32.as_pointer()))
        return context.get_dummy_value()
    return types.none(w, r, count, nb, qs, yd, j, out, a), codegen


# Q8_0 weight rows one activation row is multiplied with at once (independent chains).
Q8_0_ROWS = 4


@njit(cache=True, parallel=True)
def matmul_q8_0(ptrs, n_rows, row_bytes, d, qs, act_rows, act_start, lanes, workers):
    """engine/kernels.matmul_q8_0's contract and bits, each block's integer sum by
    vpmaddubsw (see _rows_dot_q8_0)."""
    n_mat = ptrs.shape[0]
    nb = check_q8_0(n_rows, row_bytes, d, qs, act_rows, act_start, lanes, n_mat)
    out = np.empty((act_rows.shape[0], n_rows), np.float32)
    per = (n_rows + ROWS_PER_ITEM - 1) // ROWS_PER_ITEM
    taken = work_counters(workers)
    for tid in prange(workers):
        share = 0
        while True:
            m, a0, a1, r0, share = take_item(taken, tid, share, workers, n_mat, per, act_start)
            if m < 0:
                break
            w = numba.carray(u8_pointer(ptrs[m]), (n_rows, row_bytes))
            r1 = min(n_rows, r0 + ROWS_PER_ITEM)
            for s in range(a0, a1):
                j = act_rows[s]
                r = r0
                while r1 - r >= Q8_0_ROWS:
                    _rows_dot_q8_0(w, r, Q8_0_ROWS, nb, qs, d, j, out, s)
                    r += Q8_0_ROWS
                while r < r1:
                    _rows_dot_q8_0(w, r, 1, nb, qs, d, j, out, s)
                    r += 1
    return out


# ----------------------------------------------------------------- F32 (the router)

def _cols8(builder, rows):
    """The 8x8 transpose: from 8 <8 x float> rows (row r = w[r, i..i + 7]) the 8 columns
    (column c = w[0..7, i + c]), by in-lane unpacks and shuffles and a lane swap."""
    b = builder
    sh = lambda u, v, idx: b.shuffle_vector(u, v, _idx(*idx))
    lo, hi = (0, 8, 1, 9, 4, 12, 5, 13), (2, 10, 3, 11, 6, 14, 7, 15)
    t = [sh(rows[2 * p], rows[2 * p + 1], m) for p in range(4) for m in (lo, hi)]   # t0 lo01, t1 hi01, t2 lo23 ...
    even, odd = (0, 1, 8, 9, 4, 5, 12, 13), (2, 3, 10, 11, 6, 7, 14, 15)
    u = [sh(t[q], t[q + 2], m) for q in (0, 1, 4, 5) for m in (even, odd)]          # u0 u1 (t0,t2) u2 u3 (t1,t3) ...
    low, high = (0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15)
    return [sh(u[c % 4], u[c % 4 + 4], low if c < 4 else high) for c in range(8)]


@intrinsic
def _rows_dot_f32(typingctx, w, r, k, xj, out, a, count):
    """out[a, r + q] = float32(sum_i double(float32(w[r + q, i] * xj[i]))), summed i = 0..k-1
    in order (scalar ggml_vec_dot_f32), for q < count (a literal 1..8): the rows are the lanes
    of one <8 x double> sum, each lane its own chain in order, 8 columns at a time by an 8x8
    transpose; the columns past a multiple of 8 one at a time."""
    if not (_is_array(w, types.float32, 2) and isinstance(r, types.Integer) and isinstance(k, types.Integer)
            and isinstance(xj, types.Array) and xj.dtype == types.float32 and xj.ndim == 1
            and _is_array(out, types.float32, 2) and isinstance(a, types.Integer)
            and isinstance(count, types.IntegerLiteral) and 1 <= count.literal_value <= 8):
        return None

    def codegen(context, builder, sig, args):
        b = builder
        n = sig.args[6].literal_value
        i64 = lambda v: ir.Constant(ir.IntType(64), v)
        r, k, a = (context.cast(b, args[q], sig.args[q], types.int64) for q in (1, 2, 5))
        rows = [_row(context, b, sig.args[0], args[0], types.int64, b.add(r, i64(q))) for q in range(n)]
        x = context.make_array(sig.args[3])(context, b, args[3])
        xs = cgutils.unpack_tuple(b, x.strides, 1)[0]
        xbase = b.bitcast(x.data, _I8.as_pointer())
        xat = lambda i: _load(b, xbase, b.mul(i, xs), _F32)
        v8d = ir.VectorType(ir.DoubleType(), 8)
        zero8 = _splat(_V8F32, 0.0)
        acc = cgutils.alloca_once_value(b, _splat(v8d, 0.0))

        def add_column(col, xi):
            xv = b.shuffle_vector(b.insert_element(ir.Constant(_V8F32, None), xi, ir.Constant(_I32, 0)),
                                  ir.Constant(_V8F32, None), _idx(*[0] * 8))
            b.store(b.fadd(b.load(acc), b.fpext(b.fmul(col, xv), v8d)), acc)

        k8 = b.mul(b.udiv(k, i64(8)), i64(8))
        with cgutils.for_range_slice(b, i64(0), k8, i64(8)) as (i, _):
            at = b.mul(i, i64(4))
            cols = _cols8(b, [_load(b, rows[q], at, _V8F32) if q < n else zero8 for q in range(8)])
            for c in range(8):
                add_column(cols[c], xat(b.add(i, i64(c))))
        with cgutils.for_range_slice(b, k8, k, i64(1)) as (i, _):
            col = zero8
            for q in range(n):
                col = b.insert_element(col, _load(b, rows[q], b.mul(i, i64(4)), _F32), ir.Constant(_I32, q))
            add_column(col, xat(i))
        orow = _row(context, b, sig.args[4], args[4], types.int64, a)
        s = b.load(acc)
        for q in range(n):
            v = b.fptrunc(b.extract_element(s, ir.Constant(_I32, q)), _F32)
            b.store(v, b.bitcast(b.gep(orow, [b.mul(b.add(r, i64(q)), i64(4))]), _F32.as_pointer()))
        return context.get_dummy_value()
    return types.none(w, r, k, xj, out, a, count), codegen


@njit(cache=True, parallel=True)
def matmul_f32(ptrs, n_rows, row_bytes, x, act_rows, act_start, workers):
    """engine/kernels.matmul_f32's contract and bits, 8 output rows as the lanes of one
    double-precision vector sum (_rows_dot_f32)."""
    n_mat = ptrs.shape[0]
    k = check_f32(row_bytes, x, act_rows, act_start, n_mat)
    out = np.empty((act_rows.shape[0], n_rows), np.float32)
    per = (n_rows + ROWS_PER_ITEM - 1) // ROWS_PER_ITEM
    taken = work_counters(workers)
    for tid in prange(workers):
        share = 0
        while True:
            m, a0, a1, r0, share = take_item(taken, tid, share, workers, n_mat, per, act_start)
            if m < 0:
                break
            w = numba.carray(u8_pointer(ptrs[m]), (n_rows, row_bytes)).view(np.float32)
            r1 = min(n_rows, r0 + ROWS_PER_ITEM)
            for s in range(a0, a1):
                xj = x[act_rows[s]]
                r = r0
                while r1 - r >= 8:
                    _rows_dot_f32(w, r, k, xj, out, s, 8)
                    r += 8
                if r1 - r >= 4:
                    _rows_dot_f32(w, r, k, xj, out, s, 4)
                    r += 4
                if r1 - r >= 2:
                    _rows_dot_f32(w, r, k, xj, out, s, 2)
                    r += 2
                if r1 - r == 1:
                    _rows_dot_f32(w, r, k, xj, out, s, 1)
    return out
