#!/usr/bin/env python3
"""The drift rule of `epmci history` (epmci/perf/history.py) on recorded noise.

    python bench/history_noise.py record [--runs 150] [--model ci] [--set KEY=VALUE ...]
                                         [--max-minutes 25] [--resume]
    python bench/history_noise.py analyse [--series 200] [--seed 0] [--set KEY=VALUE ...]

record: timed decode runs of the perf suite's baseline scenario, one after another, each the
way the perf suite times one (epmci.perf.measure: page cache dropped, its own process), their
tok/s appended one line a run to docs/perf-data/history-noise/<model>.jsonl with the load
before and after -- the run-to-run noise a history entry (the median of perf.repeats runs)
is made of. Quiet machine only; --resume continues a recording; --max-minutes ends a chunk.

analyse: histories made from recorded noise go through the drift rule entry by entry, as the
default branch would append them. Each entry is (--source pairs, the default) the paced
head/base ratio of perf.base_pairs process pairs drawn from bench/pairs.py recordings of
an unchanged head -- the `decode_ratio_vs_base` the workflow appends, main against its last
rebaseline -- or (--source runs) the median of perf.repeats runs drawn from the recording
above (`decode_tok_s`). Series:
- flat: 50 unchanged commits; how often a change point appears, how often the rule fails;
- staircase: 10 unchanged commits, then five 1 % slowdowns every `--every` commits; at which
  commit the rule first fails, counted from the first commit at which the total slowdown
  passes 3 % (the acceptance: within two commits).
Wilson 95 % intervals on every rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from epmci.contract.process import EngineCommand  # noqa: E402
from epmci.perf.calibration import wilson  # noqa: E402
from epmci.perf.history import FORMAT, RATIO, DriftRule, metric_drift  # noqa: E402
from epmci.perf.measure import measure  # noqa: E402
from pairs import die, pair_value, read_recording, settings, timed_setup  # noqa: E402

OUT = REPO / "docs" / "perf-data" / "history-noise"
# Both sources are judged as a gated metric is (higher is better): --source runs asks what the
# rule would do if decode_tok_s were gated, which is why it is not (epmci/perf/history.py GATED).
METRIC = f"{RATIO}/baseline"


def recording(model: str) -> Path:
    return OUT / f"{model}.jsonl"


def read_runs(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def record(a) -> int:
    cfg, model, _, spec = timed_setup(a.set, a.model)
    pc = cfg.perf
    path = recording(a.model)
    done = len(read_runs(path))
    if done and not a.resume:
        die(f"{path} already holds {done} runs: --resume to continue")
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = EngineCommand.from_setting(None)
    deadline = time.monotonic() + 60 * a.max_minutes
    print(f"[noise] {model.name}: {a.runs - done} runs to go, load {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="epmci-noise-") as td:
        for i in range(done, a.runs):
            if time.monotonic() > deadline:
                print(f"[noise] --max-minutes reached after {i} runs: --resume continues", flush=True)
                break
            load0 = os.getloadavg()[0]
            m = measure(engine, model, spec, Path(td) / f"run-{i}", timeout=cfg.engine.timeout_s,
                        label=f"noise {i}")
            if not m.ok:
                die(f"run {i} failed: {m.failure}")
            rec = {"tok_s": m.tok_s, "load_start": load0, "load_end": os.getloadavg()[0],
                   "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "model": model.name, "n_predict": pc.n_predict}
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"[noise] {i + 1}/{a.runs}: {m.tok_s:.2f} tok/s (load {load0:.2f})", flush=True)
    return 0


def history(values: list[float]) -> list[dict]:
    return [{"format": FORMAT, "commit": f"c{i:03d}", "metrics": {METRIC: v}} for i, v in enumerate(values)]


def first_failure(values: list[float], rule: DriftRule, start: int) -> int | None:
    """The first entry index >= start at which the rule fails on the history up to it."""
    for n in range(max(start, 1), len(values)):
        if metric_drift(history(values[:n + 1]), METRIC, rule).failed:
            return n
    return None


def analyse(a) -> int:
    pc = settings(a.set).perf
    rule = DriftRule.of(pc)
    rng = np.random.default_rng(a.seed)
    if a.source == "runs":
        runs = read_runs(recording(a.model))
        if len(runs) < 20:
            die(f"{recording(a.model)}: {len(runs)} runs recorded; record at least 20")
        x = np.array([r["tok_s"] for r in runs])
        rel = x / np.median(x)

        def entries(n: int) -> np.ndarray:      # n history entries of unchanged commits, relative
            return np.median(rng.choice(rel, size=(n, pc.repeats)), axis=1)
        what = (f"{len(x)} recorded runs of {runs[0]['model']}: run-to-run sd {100 * rel.std(ddof=1):.2f} %, "
                f"load {statistics.median(r['load_start'] for r in runs):.2f} (median); an entry is the median "
                f"of {pc.repeats} (decode_tok_s)")
    else:
        values = np.array([pair_value(r) for f in a.pairs.split(",") for r in read_recording(Path(f))])
        values -= np.median(values)

        def entries(n: int) -> np.ndarray:      # the paced ratio of the decision's first look
            return np.exp(rng.choice(values, size=(n, pc.base_pairs)).mean(axis=1))
        what = (f"{len(values)} recorded process pairs ({a.pairs}): per-pair sd {100 * values.std(ddof=1):.2f} %; "
                f"an entry is the paced ratio of {pc.base_pairs} pairs (decode_ratio_vs_base)")
    per_entry = entries(4000)
    print(f"{what}; an entry's sd {100 * per_entry.std(ddof=1):.2f} %")
    print(f"rule: {rule}")
    flat_cp = flat_fail = 0
    for _ in range(a.series):
        v = list(100 * entries(50))
        d = metric_drift(history(v), METRIC, rule)
        flat_cp += bool(d.change_points)
        flat_fail += first_failure(v, rule, rule.recent + 2) is not None
    delays, missed, early = [], 0, 0
    lead, steps = 10, 5
    for _ in range(a.series):
        level = np.ones(lead + steps * a.every + a.tail)
        for k in range(steps):
            level[lead + k * a.every:] *= 0.99
        v = list(100 * level * entries(len(level)))
        passing = int(np.argmax(level < 1 - pc.drift_max - 1e-9))    # first commit past the threshold
        f = first_failure(v, rule, lead)
        if f is None:
            missed += 1
        else:
            delays.append(f - passing)
            early += level[f] > 1 - 0.025
    n = a.series
    rows = [
        ("flat, 50 commits: any change point", flat_cp, n),
        ("flat, 50 commits: the rule fails (checked at every commit)", flat_fail, n),
        ("staircase: never fails", missed, n),
        ("staircase: fails while the total slowdown is under 2.5 %", early, n),
        ("staircase: fails no later than 2 commits after the total passes 3 %", sum(d <= 2 for d in delays), n),
    ]
    print("\n| series | share | 95 % CI |\n|---|---:|---|")
    for what, k, total in rows:
        lo, hi = wilson(k, total)
        print(f"| {what} | {100 * k / total:.1f} % ({k}/{total}) | [{100 * lo:.1f}, {100 * hi:.1f}] |")
    if delays:
        print(f"\ndelay from passing 3 % to the failure (commits): median {statistics.median(delays):g}, "
              f"max {max(delays)}; steps every {a.every} commits")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="history_noise.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--runs", type=int, default=150)
    r.add_argument("--model", default="ci")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--max-minutes", type=float, default=25.0)
    r.add_argument("--resume", action="store_true")
    n = sub.add_parser("analyse")
    n.add_argument("--model", default="ci")
    n.add_argument("--series", type=int, default=200)
    n.add_argument("--every", type=int, default=4, help="commits between the staircase's steps")
    n.add_argument("--tail", type=int, default=6, help="commits after the last step")
    n.add_argument("--seed", type=int, default=0)
    n.add_argument("--source", choices=("pairs", "runs"), default="pairs",
                   help="pairs: entries are paced ratios from --pairs recordings; runs: medians of recorded runs")
    n.add_argument("--pairs", default=",".join(str(REPO / "docs" / "perf-data" / "pairs-3pct" / f"{c}.jsonl")
                                               for c in ("unchanged", "unchanged-busy")),
                   help="comma-separated pair recordings (bench/pairs.py) whose noise makes the entries")
    n.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    if a.cmd == "record" and (a.runs < 1 or a.max_minutes <= 0):
        die("--runs must be >= 1 and --max-minutes > 0")
    return record(a) if a.cmd == "record" else analyse(a)


if __name__ == "__main__":
    sys.exit(main())
