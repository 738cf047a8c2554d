#!/usr/bin/env python3
"""Do the engine's logits keep every bit across settings and against an earlier engine?

    python bench/same_logits.py [--preset bench] [--ref GIT_REF] [--n-predict 8]

The tests pin this on the small models; this runs it on any preset (bench, ci35) through
the CLI: the same prompt under thread counts, micro-batch sizes, each kernel path this CPU
runs, the pager on and off, and with --ref the engine of that git ref (a temporary
worktree, its defaults) -- the logits files' sha256 must all be one. Exit 0 when they are,
1 when any differs, 2 on bad input or a run that fails.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headline import ENGINE_CTX, PROMPT, REPO, die, ref_worktree, remove_worktree  # noqa: E402

from engine.kernels import available_paths  # noqa: E402
from epmci.contract.bundled import ARGV as BUNDLED_ARGV  # noqa: E402
from epmci.contract.runspec import LOGITS_FILE, RunSpec  # noqa: E402

# (threads, micro-batch, pager): every kernel path runs each
SETTINGS = ((1, 32, False), (2, 7, False), (1, 1, False), (2, 5, True))


def logits_sha(model: str, threads: int, batch: int, pager: bool, n_predict: int, kernels: str | None,
               checkout: str) -> str:
    with tempfile.TemporaryDirectory() as td:
        spec = RunSpec(" ".join([PROMPT] * 2), n_predict=n_predict, threads=threads, ctx=ENGINE_CTX,
                       dump_logits=True, pager=pager, batch=batch)
        cmd = [*BUNDLED_ARGV, *spec.args(model, Path(td))] + (["--kernels", kernels] if kernels else [])
        what = f"-t {threads} -b {batch} {'paged' if pager else 'resident'} {kernels or checkout}"
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=checkout, timeout=1800,
                               env={**os.environ, "PYTHONPATH": checkout})
        except subprocess.TimeoutExpired:
            die(f"{what}: timeout after 1800 s")
        if r.returncode != 0:
            die(f"{what}: exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1]}")
        logits = Path(td) / LOGITS_FILE
        if not logits.is_file() or logits.stat().st_size == 0:
            die(f"{what}: the engine wrote no logits")   # nothing to compare is a failure, not a match
        return hashlib.sha256(logits.read_bytes()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--ref", help="also the engine of this git ref, with its default settings")
    ap.add_argument("--n-predict", type=int, default=8)
    a = ap.parse_args()
    from epmci.synth.store import make_model
    model = str(make_model(a.preset))
    worktree = ref_worktree(a.ref) if a.ref else None
    shas = {}
    try:
        for t, b, pager in SETTINGS:
            runs = [(k, str(REPO), k) for k in available_paths()]
            if worktree:
                runs.append((f"@{a.ref}", worktree, None))
            for label, checkout, kernels in runs:
                name = f"-t {t} -b {b} {'paged' if pager else 'resident'} {label}"
                shas[name] = logits_sha(model, t, b, pager, a.n_predict, kernels, checkout)
                print(f"{name}: {shas[name][:16]}", flush=True)
    finally:
        if worktree:
            remove_worktree(worktree)
    same = len(set(shas.values())) == 1
    print(f"{a.preset}: {len(shas)} runs, {'one sha256' if same else f'{len(set(shas.values()))} different sha256'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
