#!/usr/bin/env python3
"""One weight product per quant type and kernel path, in-process: what a kernel change buys.

    python bench/kernels.py [--paths portable,avx2] [--rows 1,32] [--threads 1] [--repeat 7]
                            [--json OUT]

Each case is the bench preset's shape for that type -- the routed experts' gate/up (Q4_K
768x2048), down (Q5_K/Q6_K 2048x768) as 16 matrices in one call (8 experts, gate and up
together, as the engine calls them), and attention's key projection (Q8_0 512x2048) --
times `rows` activation rows (1: decode; 32: a prefill micro-batch), through
engine.kernels.matmul_rows as the engine calls it (activation quantization included).
The weights are random valid blocks (epmci.synth.blocks), 8 layers' worth per case, and
each call takes the next layer's, so the bytes come from memory as in a decode.

One round times every (case, path) once, in turn; `--repeat` rounds after one warm-up (the
compile), so a load change falls on all paths alike. Figures are medians of wall time per
call; the ratio is of medians from the same run. Bytes: the weight bytes a call reads. The
outputs of every path are compared bit for bit, and a difference stops the run.

Beside them, the ceiling: how fast `--threads` threads stream memory at all (a plain
parallel sum over 512 MiB, median of the rounds), which a product bound by its weight
stream cannot pass.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np
from gguf import GGMLQuantizationType as Q
from llvmlite import binding

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import engine.kernels as K  # noqa: E402
from engine.qtypes import Q4_K, Q5_K, Q6_K, Q8_0, QTYPES  # noqa: E402
from epmci.synth.blocks import random_rows  # noqa: E402

# (qtype, output rows, k, matrices per call): the bench preset's shapes
CASES = ((Q4_K, 768, 2048, 16), (Q5_K, 2048, 768, 8), (Q6_K, 2048, 768, 8), (Q8_0, 512, 2048, 1))
LAYERS = 8
STREAM_BYTES = 512 << 20


@numba.njit(parallel=True)
def _stream_sum(a):
    t = 0
    for i in numba.prange(a.size):
        t += a[i]
    return t


def die(msg: str) -> None:
    print(f"kernels.py: {msg}", file=sys.stderr)
    sys.exit(2)


def case_name(qtype: int, n_out: int, k: int, n_mat: int) -> str:
    return f"{QTYPES[qtype].name} {n_out}x{k} x{n_mat}"


def weights(rng, qtype: int, n_out: int, k: int, n_mat: int) -> list[list[np.ndarray]]:
    """LAYERS layers of n_mat matrices, each uint8[n_out, row_bytes] of valid blocks."""
    return [[random_rows(rng, Q(qtype), n_out, k, 0.02) for _ in range(n_mat)] for _ in range(LAYERS)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", default=",".join(K.available_paths()), help="kernel paths, comma-separated")
    ap.add_argument("--rows", default="1,32", help="activation rows per call, comma-separated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7, help="timed rounds (after one warm-up round)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    paths = a.paths.split(",")
    for p in paths:
        if p not in K.available_paths():
            die(f"kernel path {p!r} is not available here (available: {', '.join(K.available_paths())})")
    try:
        row_counts = [int(r) for r in a.rows.split(",")]
    except ValueError:
        die(f"--rows must be integers, got {a.rows!r}")
    if a.repeat < 1 or a.threads < 1 or min(row_counts) < 1:
        die("--repeat, --threads and --rows must be at least 1")
    K.set_threads(a.threads)
    rng = np.random.default_rng(0)
    cases = [(c, n, weights(rng, c[0], c[1], c[2], c[3])) for c in CASES for n in row_counts]
    xs = {n: rng.standard_normal((n, 2048)).astype(np.float32) for n in row_counts}
    load_before = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, -t {a.threads}, load {load_before:.2f}", flush=True)

    def call(case, n, layer) -> tuple[float, np.ndarray]:
        (qtype, _, k, n_mat), _, ws = case
        act = K.Activation(xs[n][:, :k])
        t0 = time.perf_counter()
        y = K.matmul_rows(ws[layer], qtype, act, [np.arange(n)] * n_mat)
        return time.perf_counter() - t0, y

    times: dict[tuple[int, str], list[float]] = {(i, p): [] for i in range(len(cases)) for p in paths}
    stream = np.ones(STREAM_BYTES // 8, np.int64)
    stream_s = []
    for rnd in range(a.repeat + 1):
        t0 = time.perf_counter()
        _stream_sum(stream)
        if rnd:
            stream_s.append(time.perf_counter() - t0)
        for i, case in enumerate(cases):
            outs = {}
            for p in paths:
                K.set_kernel_path(p)
                for layer in range(LAYERS):
                    dt, outs[p] = call(case, case[1], layer)
                    if rnd:
                        times[i, p].append(dt)
                if outs[p].tobytes() != outs[paths[0]].tobytes():
                    die(f"{case_name(*case[0])}, {case[1]} rows: path {p} differs from {paths[0]}")
    load_after = os.getloadavg()[0]

    results = []
    for i, ((qtype, n_out, k, n_mat), n, ws) in enumerate(cases):
        nbytes = sum(w.nbytes for w in ws[0])
        row = {"case": case_name(qtype, n_out, k, n_mat), "rows": n, "bytes_per_call": nbytes,
               "ms": {p: 1e3 * statistics.median(times[i, p]) for p in paths}}
        row["gb_s"] = {p: nbytes / row["ms"][p] / 1e6 for p in paths}
        row["ratio_to_first"] = {p: row["ms"][paths[0]] / row["ms"][p] for p in paths[1:]}
        results.append(row)
    stream_gb_s = STREAM_BYTES / statistics.median(stream_s) / 1e9
    doc = {"threads": a.threads, "repeat": a.repeat, "calls_per_round": LAYERS, "paths": paths,
           "stream_gb_s": stream_gb_s,
           "load_before": load_before, "load_after": load_after, "cpu": binding.get_host_cpu_name(), "results": results}
    print(f"load {load_before:.2f} before, {load_after:.2f} after; memory stream at -t {a.threads}: "
          f"{stream_gb_s:.1f} GB/s\n")
    print("| case | rows | " + " | ".join(f"{p} ms (GB/s)" for p in paths)
          + "".join(f" | {paths[0]}/{p}" for p in paths[1:]) + " |")
    print("|---|---:|" + "---:|" * (2 * len(paths) - 1))
    for r in results:
        print(f"| {r['case']} | {r['rows']} | " + " | ".join(f"{r['ms'][p]:.3f} ({r['gb_s'][p]:.1f})" for p in paths)
              + "".join(f" | {r['ratio_to_first'][p]:.2f}x" for p in paths[1:]) + " |")
    if a.json:
        tmp = f"{a.json}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
