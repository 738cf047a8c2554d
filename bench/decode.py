#!/usr/bin/env python3
"""Decode tok/s of the bundled engine on the ci model: median of N runs at -t 1 and -t 2.

Each run is a fresh engine process (numba cache warm); tok/s comes from the engine's
stats JSONL (decode phase). The ratio column is against -t 1 measured in the same run.
Usage: python bench/decode.py [--repeat 5] [--n-predict 32] [--model PATH] [--pager]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from epmci.synth.store import make_model

PROMPT = "Write a short paragraph about how mixture-of-experts models route tokens."


def decode_tok_s(model: str, threads: int, n_predict: int, pager: bool) -> float:
    with tempfile.TemporaryDirectory() as td:
        stats = Path(td) / "stats.jsonl"
        cmd = [sys.executable, "-m", "engine", "-m", model, "-p", PROMPT, "-n", str(n_predict),
               "-t", str(threads), "--no-chat", "--stats-file", str(stats)]
        if not pager:
            cmd.append("--no-pager")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            sys.exit(f"engine failed ({r.returncode}): {r.stderr.strip()[-500:]}")
        recs = {json.loads(l)["phase"]: json.loads(l) for l in stats.read_text().splitlines()}
        return recs["decode"]["tok_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--model", default=None)
    ap.add_argument("--pager", action="store_true", help="paged engine (default: --no-pager)")
    a = ap.parse_args()
    model = a.model or str(make_model("ci"))
    decode_tok_s(model, 1, 2, a.pager)  # warm the numba cache and the page cache
    rows = {}
    for t in (1, 2):
        rows[t] = [decode_tok_s(model, t, a.n_predict, a.pager) for _ in range(a.repeat)]
        print(f"-t {t}: {', '.join(f'{x:.1f}' for x in rows[t])}", file=sys.stderr)
    base = statistics.median(rows[1])
    print(f"| threads | decode tok/s (median of {a.repeat}) | min | max | ratio vs -t 1 |")
    print("|---:|---:|---:|---:|---:|")
    for t, xs in rows.items():
        m = statistics.median(xs)
        print(f"| {t} | {m:.1f} | {min(xs):.1f} | {max(xs):.1f} | {m / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
