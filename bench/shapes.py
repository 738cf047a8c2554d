#!/usr/bin/env python3
"""The property sweep: `epmci check --fast` of the bundled engine on generated valid models
(epmci/synth/shapes.py), none of them a preset and none with a golden baseline.

    python bench/shapes.py [--seeds 0-31] [--out docs/perf-data/shapes.jsonl] [--resume]
                           [--max-minutes 25] [--table docs/shapes.md]
    python bench/shapes.py --render [--out ...] [--table ...]

Every shape's verdict is appended to --out as it finishes (shape, verdict, counts, skips by
reason, the plan's adjustments, seconds), so a stopped sweep keeps what it measured and
`--resume` continues with the seeds not yet in the file; --max-minutes ends a chunk cleanly
(no job here may run longer than 30 minutes). The table (--table) is rendered from the file.
A correct engine must PASS every shape: a FAIL or ERROR row is a gate defect to fix.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from epmci.fsutil import atomic_write  # noqa: E402
from epmci.perf.machine import current_commit  # noqa: E402
from epmci.synth.shapes import shape  # noqa: E402
from epmci.synth.store import shape_model  # noqa: E402

CHECK_TIMEOUT_S = 20 * 60


def seeds(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def describe(p) -> dict:
    return {"arch": p.arch, "layers": p.n_layer, "experts": p.n_expert, "used": p.n_expert_used,
            "embd": p.n_embd, "ff": p.n_ff_exp, "heads": p.n_head, "kv_heads": p.n_head_kv, "head_dim": p.head_dim,
            "vocab": p.n_vocab, "ctx": p.n_ctx, "q6k_down_layers": list(p.q6k_down_layers or ())}


def check_shape(seed: int) -> dict:
    p, path = shape(seed), shape_model(seed)
    with tempfile.TemporaryDirectory(prefix="epmci-shape-") as tmp:
        report = Path(tmp) / "report.json"
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "epmci", "check", "--fast", "--quiet", "--model", str(path),
                                   "--json", str(report)], cwd=tmp, capture_output=True, text=True,
                                  timeout=CHECK_TIMEOUT_S)
            rc, why = proc.returncode, proc.stderr.strip().splitlines()[-1:] or [""]
        except subprocess.TimeoutExpired:
            rc, why = None, [f"timed out after {CHECK_TIMEOUT_S} s"]
        seconds = time.monotonic() - t0
        data = json.loads(report.read_text()) if report.exists() else {}
    results = [r for suite in data.get("suites", []) for r in suite["results"]]
    counts = Counter(r["status"] for r in results)
    skips = Counter(r["message"] for r in results if r["status"] == "skip")
    bad = [f"{r['suite']} / {r['name']}: {r['message']}" for r in results if r["status"] in ("fail", "error")]
    verdict = {0: "PASS", 1: "FAIL"}.get(rc, "ERROR")
    return {"seed": seed, "shape": describe(p), "verdict": verdict, "returncode": rc,
            "counts": dict(counts), "skips": dict(skips), "failures": bad or ([why[0]] if rc not in (0, 1) else []),
            "adjusted": data.get("meta", {}).get("plan", {}).get("adjusted", []), "seconds": round(seconds, 1),
            "load": os.getloadavg()[0], "commit": current_commit(), "date": time.strftime("%Y-%m-%d %H:%M")}


def recorded_at(records: list[dict], what: str) -> str:
    """Which commits the records were measured at, with how many of `what` each."""
    return "Recorded at " + ", ".join(f"{c[:7]} ({n} {what})" for c, n in
                                      Counter(r.get("commit") or "unknown" for r in records).items())


def shape_text(s: dict) -> str:
    attn = "MHA" if s["kv_heads"] == s["heads"] else "MQA" if s["kv_heads"] == 1 else "GQA"
    sizes = "two sizes" if s["q6k_down_layers"] else "one size"
    return (f"{s['arch']} {s['layers']}L, {s['experts']} experts top-{s['used']}, embd {s['embd']}, "
            f"{attn} {s['heads']}/{s['kv_heads']}x{s['head_dim']}, {sizes}, vocab {s['vocab']}")


def reason(message: str) -> str:
    """A skip's reason with what names the shape's own files left out, so reasons add up."""
    return "no golden baseline (no shape has one)" if message.startswith("no golden baseline") else message


def render(records: list[dict]) -> str:
    verdicts = Counter(r["verdict"] for r in records)
    reasons = Counter(reason(m) for r in records for m, n in r["skips"].items() for _ in range(n))
    out = ["# The gate on generated models", "",
           "`python bench/shapes.py` (the bundled engine, `epmci check --fast`, no golden baseline for any shape; "
           "shapes from `epmci/synth/shapes.py`). A correct engine must pass every one.", "",
           f"{len(records)} shapes: " + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())), "",
           recorded_at(records, "shapes") + ".", "",
           "| seed | shape | verdict | passed | skipped | skips the shape made (beyond those every shape has) | s |",
           "|---|---|---|---|---|---|---|"]
    common = set.intersection(*({reason(m) for m in r["skips"]} for r in records)) if records else set()
    for r in sorted(records, key=lambda r: r["seed"]):
        by = Counter()
        for m, n in r["skips"].items():
            by[reason(m)] += n
        why = "; ".join(f"{n} x {m}" for m, n in by.items() if m not in common) or "-"
        fails = "; ".join(r["failures"])
        out.append(f"| {r['seed']} | {shape_text(r['shape'])} | {r['verdict']}{': ' + fails if fails else ''} | "
                   f"{r['counts'].get('pass', 0)} | {r['counts'].get('skip', 0)} | {why} | {r['seconds']:.0f} |")
    out += ["", "Skips by reason over all shapes (every shape has: " + "; ".join(sorted(common)) + "):", ""]
    out += [f"- {n} x {m}" for m, n in reasons.most_common()]
    return "\n".join(out) + "\n"


def sweep_arguments(doc: str, seeds: str, out: str, table: str) -> argparse.ArgumentParser:
    """The options of a resumable sweep over shapes (this script's and bench/fault_shapes.py's)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--seeds", default=seeds)
    ap.add_argument("--out", default=str(REPO / out))
    ap.add_argument("--table", default=str(REPO / table))
    ap.add_argument("--resume", action="store_true", help="skip what --out already holds")
    ap.add_argument("--max-minutes", type=float, default=25.0)
    ap.add_argument("--render", action="store_true", help="only render --table from --out")
    return ap


def recorded(out: Path, resume: bool, render: bool) -> list[dict] | None:
    """The records --out holds; None (after saying why) when a new sweep would append to them."""
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    if records and not (resume or render):
        print(f"{out}: exists; --resume continues it", file=sys.stderr)
        return None
    return records


def append(out: Path, record: dict) -> None:
    with out.open("a") as f:
        f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    a = sweep_arguments(__doc__, "0-31", "docs/perf-data/shapes.jsonl", "docs/shapes.md").parse_args(argv)
    out = Path(a.out)
    records = recorded(out, a.resume, a.render)
    if records is None:
        return 2
    if not a.render:
        done = {r["seed"] for r in records}
        t0 = time.monotonic()
        for seed in seeds(a.seeds):
            if seed in done:
                continue
            if time.monotonic() - t0 > 60 * a.max_minutes:
                print(f"stopping at --max-minutes {a.max_minutes}; --resume continues", file=sys.stderr)
                break
            r = check_shape(seed)
            records.append(r)
            append(out, r)
            print(f"shape {seed}: {r['verdict']} in {r['seconds']:.0f} s ({shape_text(r['shape'])})"
                  + "".join(f"\n  {m}" for m in r["failures"]), flush=True)
    atomic_write(a.table, render(records))
    bad = [r for r in records if r["verdict"] != "PASS"]
    print(f"{len(records)} shapes, {len(bad)} not PASS; table in {a.table}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
