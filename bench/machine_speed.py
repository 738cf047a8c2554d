#!/usr/bin/env python3
"""How steady is the machine-speed probe golden timing records (epmci/perf/speed.py)?

    python bench/machine_speed.py [--model ci] [--repeats 20] [--share 0.26] [--out FILE]

Takes the probe --repeats times in a row on one machine (nothing changed between them) and
prints, for every ordered pair of probes, the tok/s factor the one predicts against the other
at a read-wait share of --share: its spread is how much of an engine's real slowdown the
probe can wrongly "explain" (or hide) on an unchanged machine. Every probe is appended to
--out as it is taken (JSON lines), with the load.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from epmci.perf.speed import machine_factor, machine_speed  # noqa: E402
from epmci.synth.store import resolve_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(prog="machine_speed.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="ci")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--share", type=float, default=0.26, help="read-wait share of decode time")
    ap.add_argument("--out", default=str(REPO / "docs" / "perf-data" / "machine_speed.jsonl"))
    a = ap.parse_args()
    if a.repeats < 2 or not 0 <= a.share <= 1:
        print("machine_speed.py: --repeats must be >= 2 and --share from 0 to 1", file=sys.stderr)
        return 2
    model = resolve_model(a.model)
    probes = []
    for i in range(a.repeats):
        load = os.getloadavg()[0]
        p = {**machine_speed(model), "load": round(load, 2), "model": model.name,
             "time": time.strftime("%Y-%m-%d %H:%M:%S")}
        probes.append(p)
        with open(a.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(p) + "\n")
        print(f"[speed] {i + 1}/{a.repeats}: CPU workload {p['cpu_ms']:.1f} ms, disk {p['disk_mib_s']:.0f} MiB/s "
              f"(load {load:.2f})", flush=True)
    factors = sorted(machine_factor(x, y, a.share)[0] for x, y in itertools.permutations(probes, 2))

    def q(p: float) -> float:
        return factors[min(len(factors) - 1, int(p * len(factors)))]
    for key in ("cpu_ms", "disk_mib_s"):
        xs = [p[key] for p in probes]
        print(f"| {key} | median {statistics.median(xs):.2f} | sd {100 * statistics.stdev(xs) / statistics.fmean(xs):.1f} % "
              f"| range {min(xs):.2f}-{max(xs):.2f} |")
    print(f"A/A predicted tok/s factor at read-wait share {a.share:.2f} over {len(factors)} ordered probe pairs: "
          f"median x{statistics.median(factors):.3f}, 5-95 % [x{q(0.05):.3f}, x{q(0.95):.3f}], "
          f"min x{factors[0]:.3f}, max x{factors[-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
