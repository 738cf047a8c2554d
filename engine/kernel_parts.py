"""The pieces every product kernel shares (engine/kernels.py's portable kernels and
engine/kernels_x86.py's): ggml's block sizes, exact f16 scales, k-quant scales and mins,
and the work items a parallel region's threads take off a shared counter (see
engine/kernels.py, "matrix products")."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from .qtypes import Q4_K, Q5_K, Q6_K, Q8_0, QK8_0, QK_K, QTYPES

# Block sizes as module constants: numba freezes them into the kernels.
Q8_0_BYTES = QTYPES[Q8_0].block_bytes
Q4_K_BYTES = QTYPES[Q4_K].block_bytes
Q5_K_BYTES = QTYPES[Q5_K].block_bytes
Q6_K_BYTES = QTYPES[Q6_K].block_bytes

LANES = 8
U = np.uint64
ROWS_PER_ITEM = 16
# Row-wise work (activation quantization, lane-major layout, the MoE combine) runs on the
# kernels' threads from this many rows on (a prefill's micro-batch); fewer (decode) in a
# serial kernel: a parallel kernel costs ~8-10 us per call before any work, a row ~1-2 us.
PARALLEL_ROWS = 16


@intrinsic
def u8_pointer(typingctx, address):
    """int64 address -> uint8* for numba.carray. The caller keeps the memory alive (the
    Python wrapper holds the arrays the addresses were taken from for the whole call)."""
    if not isinstance(address, types.Integer):
        return None
    sig = types.CPointer(types.uint8)(address)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return sig, codegen


@intrinsic
def next_item(typingctx, counter, index):
    """Atomically counter[index] += 1; returns the old value: the next work item to take."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64 and isinstance(index, types.Integer)):
        return None
    sig = types.int64(counter, index)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        at = builder.gep(ary.data, [context.cast(builder, args[1], signature.args[1], types.intp)])
        return builder.atomic_rmw("add", at, context.get_constant(types.int64, 1), "monotonic")
    return sig, codegen


# int64s per cache line: each share's counter has a line of its own
LINE = 8


@njit(cache=True)
def work_counters(workers):
    """The counters take_item shares out work with, one per thread."""
    return np.zeros(workers * LINE, np.int64)


@njit(cache=True, inline="always")
def take_item(taken, tid, share, workers, n_mat, per, act_start):
    """The next work item for thread tid: (matrix m, its activation rows a0:a1, first output
    row r0, the share it came from), or m = -1 once all n_mat * per items are taken.

    The items are cut into `workers` contiguous shares; thread tid takes the items of share
    tid in order, off that share's counter, then helps with the shares after it (`share`
    counts how far it has moved on), so a thread the OS starts late holds up no fixed part
    of the work. Contiguous shares because two threads streaming neighbouring memory -- the
    same matrix's alternate row blocks -- ran slower together than one thread alone
    (measured; PERF.md), while two separate streams run at twice the speed of one."""
    total = n_mat * per
    while share < workers:
        t = (tid + share) % workers
        item = total * t // workers + next_item(taken, t * LINE)
        if item < total * (t + 1) // workers:
            m = item // per
            return m, act_start[m], act_start[m + 1], (item - m * per) * ROWS_PER_ITEM, share
        share += 1
    return -1, 0, 0, 0, share


@njit(cache=True)
def check_rows(n_act, act_rows, act_start):
    """act_start non-decreasing from 0 to len(act_rows), every act_row in [0, n_act)."""
    if act_start[0] != 0 or act_start[-1] != act_rows.shape[0]:
        return False
    for m in range(act_start.shape[0] - 1):
        if act_start[m + 1] < act_start[m]:
            return False
    for a in range(act_rows.shape[0]):
        if act_rows[a] < 0 or act_rows[a] >= n_act:
            return False
    return True


# POW2[e] = 2**(e - 25) (exact in float64); a frozen constant inside the kernels.
POW2 = np.array([2.0 ** (e - 25) for e in range(32)], dtype=np.float64)


@njit(cache=True, inline="always")
def f16(lo, hi):
    """IEEE binary16 (little-endian bytes lo, hi) -> float32, exact (incl. subnormals).

    normal: (1024 + m) * 2**(e-25); subnormal: m * 2**-24 (= m * POW2[1]); both exact."""
    h = np.int32(lo) | (np.int32(hi) << 8)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = np.float64(m) * POW2[1]
    elif e == 31:
        v = math.inf if m == 0 else math.nan
    else:
        v = np.float64(m | 0x400) * POW2[e]
    if h & 0x8000:
        v = -v
    return np.float32(v)


@njit(cache=True, inline="always")
def scale_min_k4(q, off, j):
    """get_scale_min_k4(j, q + off) of ggml-quants.c -> (sc, m) as int32."""
    if j < 4:
        sc = np.int32(q[off + j]) & 63
        mn = np.int32(q[off + j + 4]) & 63
    else:
        sc = (np.int32(q[off + j + 4]) & 0xF) | ((np.int32(q[off + j - 4]) >> 6) << 4)
        mn = (np.int32(q[off + j + 4]) >> 4) | ((np.int32(q[off + j]) >> 6) << 4)
    return sc, mn


@njit(cache=True)
def kquant_block_bytes(qtype, row_bytes, d, qs, bsums, act_rows, act_start, lanes, n_mat):
    """The bytes of one super-block of a k-quant product's weights, once every shape is
    checked (ValueError otherwise)."""
    n, k = qs.shape
    nb = k // QK_K
    if qtype == Q4_K:
        bb = Q4_K_BYTES
    elif qtype == Q5_K:
        bb = Q5_K_BYTES
    elif qtype == Q6_K:
        bb = Q6_K_BYTES
    else:
        raise ValueError("matmul_kquant: not a k-quant type")
    if (k % QK_K != 0 or row_bytes != nb * bb or d.shape != (n, nb) or bsums.shape != (n, nb * 16)
            or lanes != LANES or act_start.shape[0] != n_mat + 1 or not check_rows(n, act_rows, act_start)):
        raise ValueError("matmul_kquant: shape mismatch")
    return bb


@njit(cache=True)
def check_q8_0(n_rows, row_bytes, d, qs, act_rows, act_start, lanes, n_mat):
    """The blocks per row of a Q8_0 product, once every shape is checked (ValueError)."""
    n, k = qs.shape
    nb = k // QK8_0
    if (k % QK8_0 != 0 or row_bytes != nb * Q8_0_BYTES or d.shape != (n, nb) or lanes != LANES
            or act_start.shape[0] != n_mat + 1 or not check_rows(n, act_rows, act_start)):
        raise ValueError("matmul_q8_0: shape mismatch")
    return nb


@njit(cache=True)
def check_f32(row_bytes, x, act_rows, act_start, n_mat):
    """The length k of an F32 product's rows, once every shape is checked (ValueError)."""
    n, k = x.shape
    if row_bytes != 4 * k or act_start.shape[0] != n_mat + 1 or not check_rows(n, act_rows, act_start):
        raise ValueError("matmul_f32: shape mismatch")
    return k
