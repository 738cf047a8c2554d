#!/usr/bin/env python3
"""What opening a model costs the engine before any weight is read: the GGUF header parsed
by gguf-py's GGUFReader (what the engine used) against engine/gguf_file.py plus building
the tokenizer from it (what it does now), each in a fresh process, interleaved.

    python bench/gguf_open.py [--model PATH | --preset prod35-full] [--repeat 5] [--out FILE]

Per side: median wall seconds and median peak RSS (MiB) of the child, over `--repeat`
rounds after one warm-up round (page cache warm: the header pages are read once). The
load average before and after is recorded beside the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headline import REPO, write_json  # noqa: E402

SIDES = {
    "gguf-py GGUFReader": "from gguf import GGUFReader; r = GGUFReader(sys.argv[1]); n = len(r.fields)",
    "engine GGUFFile + tokenizer": ("from engine.gguf_file import GGUFFile; from engine.tokenizer import Tokenizer; "
                                    "Tokenizer.from_gguf(GGUFFile(sys.argv[1]).fields)"),
}


def open_once(code: str, model: str) -> tuple[float, float]:
    """(wall seconds of the open, peak RSS MiB) of one open in a fresh process, run by a
    fresh parent so that its children's ru_maxrss is this child's alone."""
    child = f"import sys, time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"
    parent = ("import resource, subprocess, sys; "
              f"out = subprocess.run([sys.executable, '-c', {child!r}, sys.argv[1]], check=True, "
              "capture_output=True, text=True).stdout.split()[-1]; "
              "print(out, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    r = subprocess.run([sys.executable, "-c", parent, model], capture_output=True, text=True, cwd=REPO, check=True)
    wall, rss = r.stdout.split()[-2:]
    return float(wall), float(rss)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--preset", default="prod35-full")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    model = a.model
    if model is None:
        from epmci.synth.store import cached_model_path
        model = str(cached_model_path(a.preset))
    load0 = os.getloadavg()[0]
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in SIDES}
    for rnd in range(a.repeat + 1):
        for name, code in SIDES.items():
            m = open_once(code, model)
            if rnd:   # round 0 warms the page cache
                samples[name].append(m)
    rows = {name: {"wall_s": [w for w, _ in ms], "median_wall_s": statistics.median(w for w, _ in ms),
                   "peak_rss_mib": statistics.median(r for _, r in ms)} for name, ms in samples.items()}
    result = {"model": model, "repeat": a.repeat, "load_before": load0, "load_after": os.getloadavg()[0],
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sides": rows}
    for name, r in rows.items():
        print(f"{name:30s} {r['median_wall_s']:7.2f} s  peak RSS {r['peak_rss_mib']:7.0f} MiB")
    print(f"load {load0:.2f} before, {result['load_after']:.2f} after")
    if a.out:
        write_json(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
