#!/usr/bin/env python3
"""The delta net's recurrence (engine.deltanet.gated_delta_rule) against another commit's, in-process.

    python bench/deltanet.py --ref REF [--rows 1,32] [--threads 2] [--repeat 5] [--json OUT]

The production shape (prod35: 32 value heads, 16 key heads, state 128 x 128) on 30 layers'
states, 60 MB, so each call reads and writes its state from memory as in a decode; `rows`
tokens per call (1: decode; 32: a prefill micro-batch). Each round times both kernels over
all layers, in turn; medians of ms per layer and the ratio of medians. The two kernels'
outputs and states are compared bit for bit first (each state in its own layout: "kept as
[j, i, m]" in a module's docstring, else llama.cpp's [j, m, i]), and a difference stops the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
LAYERS, V, G, DS = 30, 32, 16, 128
TREE = "working tree"


def module_at(ref: str, workdir: Path):
    """engine/deltanet.py as of git ref, imported under its own name."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:engine/deltanet.py"],
                         capture_output=True, text=True, check=True).stdout
    path = workdir / f"deltanet_{ref.replace('/', '_')}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def key_major(mod) -> bool:
    """Whether mod keeps the state as [j, i, m] (else llama.cpp's [j, m, i])."""
    return "kept as [j, i, m]" in (mod.__doc__ or "")


def state_for(mod, s: np.ndarray) -> np.ndarray:
    """s ([j, m, i]) in mod's layout."""
    return np.ascontiguousarray(s.transpose(0, 2, 1)) if key_major(mod) else s.copy()


def inputs(rng, n: int):
    q = rng.standard_normal((n, G, DS)).astype(np.float32)
    k = rng.standard_normal((n, G, DS)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((n, V, DS)).astype(np.float32)
    decay = rng.uniform(0.9, 1.0, (n, V)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (n, V)).astype(np.float32)
    return q, k, v, decay, beta, np.float32(1 / np.sqrt(DS))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="the commit to compare with")
    ap.add_argument("--rows", default="1,32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ["NUMBA_NUM_THREADS"] = str(a.threads)   # numba sizes its pool once, at import
    import numba
    from engine import deltanet as tree_module
    assert numba.get_num_threads() == a.threads, (numba.get_num_threads(), a.threads)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        kernels = {TREE: tree_module, a.ref: module_at(a.ref, Path(tmp))}
        results = []
        for n in map(int, a.rows.split(",")):
            args = inputs(rng, n)
            start = [rng.standard_normal((V, DS, DS)).astype(np.float32) for _ in range(LAYERS)]
            states = {name: [state_for(mod, s) for s in start] for name, mod in kernels.items()}
            outs = {name: [mod.gated_delta_rule(*args[:5], s, args[5]) for s in states[name]]
                    for name, mod in kernels.items()}
            def llama_layout(name):
                return [s.transpose(0, 2, 1) if key_major(kernels[name]) else s for s in states[name]]
            if not (all(o.tobytes() == p.tobytes() for o, p in zip(outs[a.ref], outs[TREE])) and
                    all(b.tobytes() == c.tobytes() for b, c in zip(llama_layout(a.ref), llama_layout(TREE)))):
                print(f"rows {n}: {a.ref} and the working tree differ", file=sys.stderr)
                return 1
            ms = {name: [] for name in kernels}
            for _ in range(a.repeat):
                for name, mod in kernels.items():
                    t0 = time.perf_counter()
                    for s in states[name]:
                        mod.gated_delta_rule(*args[:5], s, args[5])
                    ms[name].append(1e3 * (time.perf_counter() - t0) / LAYERS)
            med = {name: statistics.median(v) for name, v in ms.items()}
            results.append({"rows": n, "threads": a.threads, "ms_per_layer": ms, "median": med,
                            "speedup": med[a.ref] / med[TREE]})
            print(f"rows {n}, -t {a.threads}: ms per layer: working tree {med[TREE]:.3f}, {a.ref} {med[a.ref]:.3f} "
                  f"({med[a.ref] / med[TREE]:.2f}x as fast); same bits")
    if a.json:
        Path(a.json).write_text(json.dumps({"ref": a.ref, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
