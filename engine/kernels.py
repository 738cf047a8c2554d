"""Numba kernels of the engine: activation quantization, quantized mat-vec/mat-mat
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
  Integer sums are exact, so how they are formed does not matter: the kernels form
  each lane's sum in a vectorized loop over the 8 lanes (see "matrix products" below).
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
* ``matmul_rows`` is the one dispatcher (``matmul`` is its one-matrix case; the forward
  pass and the tests call them): it quantizes an ``Activation`` to the weight type's
  vec_dot_type (engine/qtypes.py) once and runs that type's kernel over one matrix or
  several (a layer's experts), each with its own activation rows.

Kernel paths: the k-quant and Q8_0 products also exist in engine/kernels_x86.py (x86's
byte multiply-add on 256-bit ("avx2") or 512-bit ("avx512") vectors, for the k-quants over
lane-major bytes: the same integers, so the same bits); ``set_kernel_path`` chooses
("auto": the fastest this CPU runs), the engine from ``--kernels`` / EPM_KERNELS. The block
sizes, f16 scales and work items every path uses are in engine/kernel_parts.py.

Determinism: the kernels are ``parallel=True``; the matrix products' threads take work items --
fixed chunks of OUTPUT rows (of one or several matrices) -- from a shared counter. Every
output element is produced by one sequential loop whose order does not depend on which
thread runs it or how many there are, so results are bit-identical for any ``set_threads``.
No fastmath anywhere (it would allow reassociation/contraction); every float operation
is written on np.float32 operands so numba does not widen to float64.
"""

from __future__ import annotations

import math
from itertools import accumulate

import numba
import numpy as np
from numba import njit, prange

from .contract_info import KERNEL_CPU_FLAGS, KERNEL_PATHS, numba_compiles_for_host
from .kernel_parts import (LANES, PARALLEL_ROWS, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_0_BYTES, ROWS_PER_ITEM, U, check_f32,
                           check_q8_0, f16, kquant_block_bytes, scale_min_k4, take_item, u8_pointer, work_counters)
from .qtypes import F32, Q4_K, Q5_K, Q6_K, Q8_0, Q8_K, QK8_0, QK_K, qtype_info



# ------------------------------------------------------------- kernel paths
#
# The k-quant and Q8_0 products exist as the portable loops below (any CPU numba targets)
# and in engine/kernels_x86.py (vpmaddubsw, which numba never emits itself), whose k-quant
# products run on 256-bit vectors ("avx2") or 512-bit ones ("avx512": AVX-512BW/VL; its
# Q8_0 and F32 products are AVX2's; F32 with rows as vector lanes). All give the same bits; "auto" takes the fastest the CPU runs.
# The SIMD module is imported, and each width compiled, only when chosen: on a CPU without
# the extension its instructions do not exist.
_path = {"name": "portable", "kquant": None, "q8_0": None, "f32": None}


def available_paths() -> tuple[str, ...]:
    """The kernel paths this CPU runs, slowest first: those whose CPU flags it has
    (KERNEL_CPU_FLAGS), the SIMD ones only while numba compiles for this host."""
    from llvmlite import binding
    host = numba_compiles_for_host()
    has = binding.get_host_cpu_features()
    return tuple(p for p, flags in KERNEL_CPU_FLAGS.items() if not flags or host and all(has.get(f) for f in flags))


def set_kernel_path(name: str) -> str:
    """Choose the k-quant kernels: "auto" (the fastest available), "portable", "avx2" or "avx512".
    ValueError names a path that does not exist or that this CPU cannot run."""
    avail = available_paths()
    chosen = avail[-1] if name == "auto" else name
    if chosen not in KERNEL_PATHS:
        raise ValueError(f"kernel path {name!r}: expected auto or one of {', '.join(KERNEL_PATHS)}")
    if chosen not in avail:
        raise ValueError(f"kernel path {name!r}: this CPU (or NUMBA_CPU_NAME) does not allow it; "
                         f"available: {', '.join(avail)}")
    if chosen in ("avx2", "avx512"):
        from . import kernels_x86
        _path.update(name=chosen, q8_0=kernels_x86.matmul_q8_0, f32=kernels_x86.matmul_f32,
                     kquant=kernels_x86.matmul_kquant_512 if chosen == "avx512" else kernels_x86.matmul_kquant)
    else:
        _path.update(name=chosen, kquant=None, q8_0=None, f32=None)
    return chosen


def kernel_path() -> str:
    return _path["name"]


def set_threads(n: int) -> None:
    """Set the number of numba worker threads (results do not depend on it)."""
    numba.set_num_threads(int(n))


def get_threads() -> int:
    return numba.get_num_threads()


# ------------------------------------------------------------- activation quantization

@njit(cache=True, inline="always")
def _quantize_row_q8_K(x, r, d, qs, bsums):
    nb = x.shape[1] // QK_K
    magic = np.float32(12582912.0)
    m127 = np.float32(-127.0)
    one = np.float32(1.0)
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


def _q8_K_arrays(n, k):
    return np.zeros((n, k // QK_K), np.float32), np.zeros((n, k), np.int8), np.zeros((n, k // 16), np.int16)


@njit(cache=True)
def _quantize_q8_K_serial(x, d, qs, bsums):
    for r in range(x.shape[0]):
        _quantize_row_q8_K(x, r, d, qs, bsums)


@njit(cache=True, parallel=True)
def _quantize_q8_K_parallel(x, d, qs, bsums):
    for r in prange(x.shape[0]):
        _quantize_row_q8_K(x, r, d, qs, bsums)


def quantize_q8_K(x):
    """x float32[n, k] (k % 256 == 0) -> (d f32[n, k/256], qs i8[n, k], bsums i16[n, k/16]);
    rows on the kernels' threads from PARALLEL_ROWS on."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK_K != 0:
        raise ValueError("quantize_q8_K: x must be (n, k) with k a multiple of 256")
    out = _q8_K_arrays(*x.shape)
    (_quantize_q8_K_parallel if x.shape[0] >= PARALLEL_ROWS else _quantize_q8_K_serial)(x, *out)
    return out


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


# ------------------------------------------------------------- matrix products
#
# A product call multiplies M weight matrices of one type and shape (the experts of a
# layer, or a single dense matrix) each with its own subset of the activation rows:
# matrix m takes rows act_rows[act_start[m]:act_start[m + 1]] and writes output rows
# act_start[m].. . The matrices are passed as addresses (see u8_pointer), so one call --
# one parallel region -- covers them all. Work items are (matrix, 16 output rows), which
# the `workers` threads take from a shared counter as they come free (on a shared machine a
# thread the OS keeps waiting then holds up no fixed share of the work); each output
# element is computed by one item, in ggml's order, whatever the thread count.
#
# A k-quant super-block is first unpacked into its 256 quants, a byte each (a vectorized
# loop), once for all activation rows. Its integer work is then a loop over its 8 lanes
# (`lanes` = 8; value p of a block is in lane p % 8, as aux32[l] in the C): each lane reads
# consecutive bytes, so LLVM turns the loop into 8-wide vector code. `lanes` is passed at run time because with a
# compile-time trip count of 8 LLVM unrolls the loop and leaves it scalar (numba runs
# LLVM's SLP vectorizer off). Indices in lane loops are cast to uint64: numba then skips
# its negative-index wraparound, which would hide from LLVM that the lanes are consecutive.
# The float work of a block (8 lane products and sums) is in the same loop, one rounding
# per operation and lane, so vectorizing it does not change a bit.

@njit(cache=True, inline="always")
def _block_q4_K(wr, i, d, qs, bsums, rows, lanes, scm, u, sums, sumf):
    """Super-block i of a Q4_K row wr, for activation rows `rows`: sums[s, l] += d * aux32[l];
    sumf[s] -= dmin * sumi (ggml_vec_dot_q4_K_q8_K_generic). The quants are unpacked into u
    once (a vectorized loop over the 32 bytes of each 64 values, `lanes` * 4 at run time),
    then used by every activation row."""
    o = i * Q4_K_BYTES
    xd = f16(wr[o], wr[o + 1])
    xm = f16(wr[o + 2], wr[o + 3])
    _scales_mins_k4(wr, o + 4, scm)
    for x in range(4 * lanes):
        for c in range(4):
            b = wr[U(o + 16 + 32 * c + x)]
            u[U(64 * c + x)] = b & 0xF
            u[U(64 * c + 32 + x)] = b >> 4
    for s in range(rows.shape[0]):
        j = rows[s]
        _lanes_unpacked(u, 32, qs, j, i * QK_K, scm, lanes, np.float32(xd * d[j, i]), sums, s)
        mins_term(xm, d[j, i], bsums, j, i, scm, sumf, s)


@njit(cache=True, inline="always")
def _scales_mins_k4(wr, off, scm):
    """The 8 6-bit scales (scm[0:8]) and mins (scm[8:16]) of a Q4_K/Q5_K super-block."""
    for g in range(8):
        sc, mn = scale_min_k4(wr, off, g)
        scm[g] = sc
        scm[8 + g] = mn


@njit(cache=True)
def most_rows(act_start):
    """The most activation rows any one matrix takes."""
    most = 0
    for m in range(act_start.shape[0] - 1):
        most = max(most, act_start[m + 1] - act_start[m])
    return most


@njit(cache=True, inline="always")
def sum_lanes(sums, sumf, cnt, out, a0, r):
    """out[a0 + s, r] = sumf[s] + sums[s, 0] + ... + sums[s, 7] in that order (the C's
    final `sumf += sums[l]`), for the cnt activation rows of one weight row."""
    for s in range(cnt):
        acc = sumf[s]
        for l in range(LANES):
            acc = np.float32(acc + sums[s, l])
        out[a0 + s, r] = acc


@njit(cache=True, inline="always")
def mins_term(xm, yd, bsums, j, i, scm, sumf, s):
    """sumf[s] -= dmin * sumi, sumi = sum_g bsums[j, 16i + g] * mins[g/2] (Q4_K and Q5_K),
    for activation row j. (Rows are indexed, never sliced, in the kernels' loops: a slice
    is an atomic reference count on the array, which the threads then fight over.)"""
    sumi = np.int32(0)
    for g in range(8):   # bsums[2g], bsums[2g + 1] share mins[g]
        sumi += (np.int32(bsums[j, i * 16 + 2 * g]) + np.int32(bsums[j, i * 16 + 2 * g + 1])) * scm[8 + g]
    dmin = np.float32(xm * yd)
    sumf[s] = np.float32(sumf[s] - np.float32(dmin * np.float32(sumi)))


@njit(cache=True, inline="always")
def _lanes_unpacked(u, group, qs, j, yo, scm, lanes, dd, sums, s):
    """sums[s, l] += dd * aux32[l] for a super-block unpacked into u (256 quants in value
    order) times activation row j of qs from yo, `group` consecutive values sharing each
    scale scm[g]."""
    for l in range(lanes):
        aux = np.int32(0)
        for g in range(QK_K // group):
            p = np.int32(0)
            for m in range(group // 8):
                x = group * g + 8 * m + l
                p = np.int32(p + np.int32(np.int32(u[U(x)]) * np.int32(qs[j, U(yo + x)])))
            aux = np.int32(aux + np.int32(scm[g] * p))
        sums[s, U(l)] = np.float32(sums[s, U(l)] + np.float32(dd * np.float32(aux)))


@njit(cache=True, inline="always")
def _block_q5_K(wr, i, d, qs, bsums, rows, lanes, scm, u, sums, sumf):
    """Super-block i of a Q5_K row wr, for activation rows `rows`: as Q4_K, with a fifth bit
    per value from qh[x], bit 2c (low nibbles) or 2c + 1 (high nibbles) of chunk c."""
    o = i * Q5_K_BYTES
    xd = f16(wr[o], wr[o + 1])
    xm = f16(wr[o + 2], wr[o + 3])
    _scales_mins_k4(wr, o + 4, scm)
    for x in range(4 * lanes):
        h = wr[U(o + 16 + x)]
        for c in range(4):
            b = wr[U(o + 48 + 32 * c + x)]
            u[U(64 * c + x)] = (b & 0xF) | (((h >> (2 * c)) & 1) << 4)
            u[U(64 * c + 32 + x)] = (b >> 4) | (((h >> (2 * c + 1)) & 1) << 4)
    for s in range(rows.shape[0]):
        j = rows[s]
        _lanes_unpacked(u, 32, qs, j, i * QK_K, scm, lanes, np.float32(xd * d[j, i]), sums, s)
        mins_term(xm, d[j, i], bsums, j, i, scm, sumf, s)


@njit(cache=True, inline="always")
def _block_q6_K(wr, i, d, qs, rows, lanes, scm, q6, sums):
    """Super-block i of a Q6_K row wr for activation rows `rows`: sums[s, l] += d * aux32[l]
    (ggml_vec_dot_q6_K_q8_K_generic). In each half h of 128 values, byte x < 32 of ql
    (ql[64h + x], ql[64h + 32 + x]) and of qh (qh[32h + x]) make the values 128h + 32t + x,
    t = 0..3, as (4 low bits | 2 high bits << 4) - 32; 16 consecutive values share a scale.
    Unpacked into q6 first, as Q4_K."""
    o = i * Q6_K_BYTES
    xd = f16(wr[o + 208], wr[o + 209])
    for g in range(16):
        scm[g] = np.int32(np.int8(wr[o + 192 + g]))
    for x in range(4 * lanes):
        for h in range(2):
            a = wr[U(o + 64 * h + x)]
            b = wr[U(o + 64 * h + 32 + x)]
            qh = wr[U(o + 128 + 32 * h + x)]
            q6[U(128 * h + x)] = ((a & 0xF) | ((qh & 3) << 4)) - 32
            q6[U(128 * h + 32 + x)] = ((b & 0xF) | (((qh >> 2) & 3) << 4)) - 32
            q6[U(128 * h + 64 + x)] = ((a >> 4) | (((qh >> 4) & 3) << 4)) - 32
            q6[U(128 * h + 96 + x)] = ((b >> 4) | (((qh >> 6) & 3) << 4)) - 32
    for s in range(rows.shape[0]):
        j = rows[s]
        _lanes_unpacked(q6, 16, qs, j, i * QK_K, scm, lanes, np.float32(xd * d[j, i]), sums, s)


@njit(cache=True, parallel=True)
def matmul_kquant(ptrs, n_rows, row_bytes, qtype, d, qs, bsums, act_rows, act_start, lanes, workers):
    """Matrices of type Q4_K, Q5_K or Q6_K (uint8[n_rows, row_bytes] at ptrs[m]) times Q8_K
    activations (d, qs, bsums) of x[n, k] -> float32[len(act_rows), n_rows] (see above).
    One kernel for the three: they differ only in how a super-block is read (Q6_K has no
    mins, so bsums is unused for it)."""
    n_mat = ptrs.shape[0]
    kquant_block_bytes(qtype, row_bytes, d, qs, bsums, act_rows, act_start, lanes, n_mat)
    nb = qs.shape[1] // QK_K
    out = np.empty((act_rows.shape[0], n_rows), np.float32)
    per = (n_rows + ROWS_PER_ITEM - 1) // ROWS_PER_ITEM
    most = most_rows(act_start)
    taken = work_counters(workers)
    for tid in prange(workers):
        share = 0
        sums = np.empty((most, LANES), np.float32)   # C: sums[8] of each output
        sumf = np.empty(most, np.float32)             # C: sumf
        scm = np.empty(16, np.int32)                  # one super-block's scales (and mins)
        u = np.empty(QK_K, np.uint8)                  # one super-block's Q4_K/Q5_K quants
        q6 = np.empty(QK_K, np.int8)                  # one super-block's Q6_K quants
        while True:
            m, a0, a1, r0, share = take_item(taken, tid, share, workers, n_mat, per, act_start)
            if m < 0:
                break
            cnt = a1 - a0
            rows = act_rows[a0:a1]
            w = numba.carray(u8_pointer(ptrs[m]), (n_rows, row_bytes))
            for r in range(r0, min(n_rows, r0 + ROWS_PER_ITEM)):
                wr = w[r]
                sums[:cnt] = 0
                sumf[:cnt] = 0
                for i in range(nb):
                    if qtype == Q4_K:
                        _block_q4_K(wr, i, d, qs, bsums, rows, lanes, scm, u, sums, sumf)
                    elif qtype == Q5_K:
                        _block_q5_K(wr, i, d, qs, bsums, rows, lanes, scm, u, sums, sumf)
                    else:
                        _block_q6_K(wr, i, d, qs, rows, lanes, scm, q6, sums)
                sum_lanes(sums, sumf, cnt, out, a0, r)
    return out


@njit(cache=True, parallel=True)
def matmul_q8_0(ptrs, n_rows, row_bytes, d, qs, act_rows, act_start, lanes, workers):
    """Q8_0 matrices (uint8[n_rows, row_bytes] at ptrs[m]) times Q8_0 activations (d = f16
    values as f32, qs) -> float32[len(act_rows), n_rows] (see above)."""
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
            for r in range(r0, min(n_rows, r0 + ROWS_PER_ITEM)):
                wr = w[r]
                for s in range(a1 - a0):
                    j = act_rows[a0 + s]
                    sumf = np.float32(0.0)
                    for i in range(nb):
                        o = i * Q8_0_BYTES
                        sumi = np.int32(0)
                        for x in range(4 * lanes):   # the block's 32 products: a vectorized reduction
                            sumi = np.int32(sumi + np.int32(np.int32(np.int8(wr[U(o + 2 + x)]))
                                                            * np.int32(qs[j, U(i * QK8_0 + x)])))
                        xd = f16(wr[o], wr[o + 1])
                        sumf = np.float32(sumf + np.float32(np.float32(sumi) * np.float32(xd * d[j, i])))
                    out[a0 + s, r] = sumf
    return out


@njit(cache=True, parallel=True)
def matmul_f32(ptrs, n_rows, row_bytes, x, act_rows, act_start, workers):
    """F32 matrices (n_rows rows of row_bytes = 4k bytes at ptrs[m]) times x float32[n, k]
    -> float32[len(act_rows), n_rows]: out = float32(sum_i double(float32(w[r, i] * x[j, i]))),
    summed sequentially i = 0..k-1 in double (scalar ggml_vec_dot_f32). Four output rows
    advance together (independent chains) for throughput; that does not change any chain."""
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
            for s in range(a1 - a0):
                xj = x[act_rows[a0 + s]]
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
                    out[a0 + s, r] = np.float32(s0)
                    out[a0 + s, r + 1] = np.float32(s1)
                    out[a0 + s, r + 2] = np.float32(s2)
                    out[a0 + s, r + 3] = np.float32(s3)
                    r += 4
                while r < r1:
                    wr = w[r]
                    s0 = 0.0
                    for i in range(k):
                        s0 += np.float64(np.float32(wr[i] * xj[i]))
                    out[a0 + s, r] = np.float32(s0)
                    r += 1
    return out


# ------------------------------------------------------------- dequantization

@njit(cache=True, parallel=True)
def _dequant_q8_0(w):
    rows = w.shape[0]
    nb = w.shape[1] // Q8_0_BYTES
    out = np.empty((rows, nb * QK8_0), np.float32)
    for r in prange(rows):
        for i in range(nb):
            o = i * Q8_0_BYTES
            dd = f16(w[r, o], w[r, o + 1])
            for l in range(QK8_0):
                out[r, i * QK8_0 + l] = np.float32(np.float32(np.int8(w[r, o + 2 + l])) * dd)
    return out


@njit(cache=True, parallel=True)
def _dequant_q45_K(w, five):
    rows = w.shape[0]
    bpb = Q5_K_BYTES if five else Q4_K_BYTES
    nb = w.shape[1] // bpb
    out = np.empty((rows, nb * QK_K), np.float32)
    for r in prange(rows):
        for i in range(nb):
            o = i * bpb
            dd = f16(w[r, o], w[r, o + 1])
            dm = f16(w[r, o + 2], w[r, o + 3])
            qo = o + (48 if five else 16)
            for c in range(4):
                sc0, m0 = scale_min_k4(w[r], o + 4, 2 * c)
                sc1, m1 = scale_min_k4(w[r], o + 4, 2 * c + 1)
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
    nb = w.shape[1] // Q6_K_BYTES
    out = np.empty((rows, nb * QK_K), np.float32)
    for r in prange(rows):
        for i in range(nb):
            o = i * Q6_K_BYTES
            dd = f16(w[r, o + 208], w[r, o + 209])
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


_QUANTIZE = {Q8_K: quantize_q8_K, Q8_0: quantize_q8_0, F32: lambda x: (x,)}


def _kquant(qtype: int):
    def kernel(ptrs, n_rows, row_bytes, act_rows, act_start, d, qs, bsums):
        return (_path["kquant"] or matmul_kquant)(ptrs, n_rows, row_bytes, qtype, d, qs, bsums, act_rows,
                                                   act_start, LANES, get_threads())
    return kernel


def _q8_0(ptrs, n_rows, row_bytes, act_rows, act_start, d, qs):
    return (_path["q8_0"] or matmul_q8_0)(ptrs, n_rows, row_bytes, d, qs, act_rows, act_start, LANES, get_threads())


def _f32(ptrs, n_rows, row_bytes, act_rows, act_start, x):
    return (_path["f32"] or matmul_f32)(ptrs, n_rows, row_bytes, x, act_rows, act_start, get_threads())


_MATMUL = {Q4_K: _kquant(Q4_K), Q5_K: _kquant(Q5_K), Q6_K: _kquant(Q6_K), Q8_0: _q8_0, F32: _f32}


def matmul_rows(ws, qtype: int, a: Activation, rows_of) -> np.ndarray:
    """Several matrices of one type and shape, each times its own activation rows:
    ws[m] (uint8[rows, row_bytes]; float32[rows, k] for F32) times the rows rows_of[m] of a.
    Returns float32[sum(len(rows_of[m])), rows]: matrix 0's output rows, then matrix 1's...
    One kernel call (one parallel region) for all of them."""
    t = qtype_info(qtype)
    shape = ws[0].shape
    for w in ws:
        if w.shape != shape or w.ndim != 2 or not w.flags.c_contiguous:
            raise ValueError(f"matmul: weights must be C-contiguous 2-D arrays of one shape, got {w.shape}")
        if w.dtype != (np.float32 if t.vec_dot_type == F32 else np.uint8):
            raise ValueError(f"matmul: {t.name} weights cannot be {w.dtype}")
    ptrs = np.fromiter((w.ctypes.data for w in ws), np.int64, len(ws))
    act_start = np.fromiter(accumulate(map(len, rows_of), initial=0), np.int64, len(ws) + 1)
    act_rows = np.asarray(np.concatenate(rows_of) if len(ws) > 1 else rows_of[0], dtype=np.int64)
    return _MATMUL[int(qtype)](ptrs, shape[0], shape[1] * ws[0].itemsize, act_rows, act_start,
                               *a.quantized(t.vec_dot_type))


def matmul(w: np.ndarray, qtype: int, a: Activation | np.ndarray) -> np.ndarray:
    """y[n, rows] = W x as ggml's CPU backend computes it, for weight rows w of type qtype
    (uint8[rows, row_bytes]; float32[rows, k] for F32) and activations a (x float32[n, k]):
    x is quantized to the type's vec_dot_type, then the type's kernel runs."""
    if not isinstance(a, Activation):
        a = Activation(a)
    return matmul_rows([w], qtype, a, [np.arange(a.x.shape[0])])
