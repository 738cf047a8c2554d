#!/usr/bin/env python3
"""The paced perf gate's error rates from recorded process pairs (epmci/perf/calibration.py).

    python bench/pairs.py record --conditions unchanged,slow3,slow5,io5 [--busy] [--pairs 40]
                                 [--model M] [--set KEY=VALUE ...]
                                 [--max-minutes 25] [--out docs/perf-data/pairs] [--resume]
    python bench/pairs.py analyse [--out docs/perf-data/pairs] [--decisions 4000] [--set KEY=VALUE ...] [--steps N]
                                  [--shift 0.99,0.97 [--shift-from unchanged,slow5]]

record: process pairs of `epmci check --perf-base` (epmci.perf.paced.run_pair, the perf
suite's baseline scenario, perf.base_steps decode steps after perf.base_warmup_steps), base =
the bundled engine, head = the bundled engine (`unchanged`) or a copy made slower
(bench/perf_gate_calibration.py's heads: `slowX` X % more compute, `ioX` delayed reads; on
the paged ci scenario). Conditions are interleaved pair by pair. `--set` takes epmci.yaml
settings as `epmci check --set` does (the production-size model's, say). Before the first
pair the gate's own step 1 (epmci.perf.paced.operating_point) probes the engine twice and
picks the run: the scenario's, or one reduced arena for both sides when two engines do not
fit the memory (run it inside the runner's memory cap); every pair records its arena. `--busy` runs one CPU hog
beside the pairs (a shared runner). Every pair is appended to OUT/<condition>[-busy].jsonl
as it finishes -- its every step's wall and CPU time, the load, the time -- so a stopped run
keeps what it measured and `--resume` continues to --pairs per condition. --max-minutes
ends the chunk cleanly (no job here may run longer than 30 minutes).

analyse: for every recording, replays --decisions decisions through the gate's own
sequential decision and prints a Markdown table: false alarms (unchanged) or detection
(slowed), SAME, UNKNOWN, pairs per decision, with Wilson 95 % intervals, the recorded pairs
(what bounds the precision), the per-pair noise, the drift check and how often the p99
latency verdict fails on pairs drawn the same way (for an unchanged head: its false alarms);
then the real decisions
the recording holds, in the order it was taken (epmci.perf.calibration.in_order).
"""

from __future__ import annotations

import argparse
import json
import math
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from perf_gate_calibration import declared, heads  # noqa: E402

from epmci.compare.stats import hodges_lehmann  # noqa: E402
from epmci.config import load_config, parse_set  # noqa: E402
from epmci.contract.process import EngineCommand  # noqa: E402
from epmci.perf.abba import Side  # noqa: E402
from epmci.perf.calibration import drift, in_order, replay, replay_p99, wilson  # noqa: E402
from epmci.contract.memory import min_arena_mib  # noqa: E402
from epmci.errors import InputError  # noqa: E402
from epmci.cgroups import available_memory_mib  # noqa: E402
from epmci.perf.paced import PacedResult, PairFailed, Unpaceable, operating_point, paced_spec, run_pair  # noqa: E402
from epmci.perf.plan import timed_scenario  # noqa: E402
from epmci.synth.store import resolve_model  # noqa: E402

HOG = "while True: pass"


def die(msg: str) -> None:
    print(f"pairs.py: {msg}", file=sys.stderr)
    sys.exit(2)


def recording_path(out: Path, condition: str, busy: bool) -> Path:
    return out / f"{condition}{'-busy' if busy else ''}.jsonl"


def read_recording(path: Path) -> list[dict]:
    """The pairs of one recording; a line cut short by a killed run is dropped, not fatal."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def pair_value(rec: dict, kind: str = "wall", steps: int | None = None) -> float:
    """The pair's value for the decision: Hodges-Lehmann of log(base time / head time) per step
    (of its first `steps` measured steps: a recording of longer pairs stands in for shorter)."""
    w = rec["warmup"]
    b, h = np.asarray(rec[f"base_{kind}"][w:][:steps]), np.asarray(rec[f"head_{kind}"][w:][:steps])
    return hodges_lehmann(np.log(b / h))


def pair_seconds(rec: dict, steps: int | None = None) -> float:
    """The pair's wall time had it measured only `steps` steps: its recorded seconds less the
    wall of the steps beyond (both sides step one after the other)."""
    w = rec["warmup"]
    cut = sum(rec["base_wall"][w:][steps:]) + sum(rec["head_wall"][w:][steps:]) if steps is not None else 0.0
    return rec["seconds"] - cut


def settings(sets: list[str]):
    """epmci.yaml's settings with `--set KEY=VALUE` items; a bad one is one line, exit 2."""
    try:
        return load_config(None, parse_set(sets))
    except InputError as e:
        die(str(e))


def timed_setup(sets: list[str], model_name: str):
    """(settings derived for the model, its path, facts, the perf suite's timed run of it)."""
    model = resolve_model(model_name)
    cfg, facts, spec = timed_scenario(settings(sets), model)
    return cfg, model, facts, spec


def record(a) -> int:
    cfg, model, facts, spec = timed_setup(a.set, a.model)
    pc = cfg.perf
    spec = paced_spec(spec, pc.base_warmup_steps, pc.base_steps)
    conditions = [c for c in a.conditions.split(",") if c]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    done = {c: len(read_recording(recording_path(out, c, a.busy))) for c in conditions}
    if not a.resume and any(done.values()):
        die(f"{out} already holds pairs of {', '.join(c for c, n in done.items() if n)}: --resume to continue")
    todo = [c for k in range(a.pairs) for c in conditions if done[c] <= k]
    deadline = time.monotonic() + 60 * a.max_minutes
    rng = np.random.default_rng(a.seed if a.seed is not None else int(time.time()))
    hog = subprocess.Popen([sys.executable, "-c", HOG]) if a.busy else None
    print(f"[pairs] {model.name}, {len(todo)} pairs to go ({sum(done.values())} recorded), busy={a.busy}, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="epmci-pairs-") as td:
            tmp = Path(td)
            engines = {n: declared(e, cfg.engine.timeout_s)
                       for n, e in heads(tmp, sorted(set(conditions)), a.io_delay_ms / 1e3, a.io_every).items()}
            base = Side("base", declared(EngineCommand.from_setting(None), cfg.engine.timeout_s))
            point = PacedResult()
            try:
                spec = operating_point(Side("head", base.engine), base, model, spec, tmp / "probes",
                                       cfg.engine.timeout_s, point, min_arena_mb=min_arena_mib(spec, facts),
                                       available=available_memory_mib, say=print)
            except (Unpaceable, PairFailed) as e:
                die(f"cannot pace two engines here: {e}")
            for i, c in enumerate(todo):
                if time.monotonic() > deadline:
                    print(f"[pairs] --max-minutes {a.max_minutes} reached: {len(todo) - i} pairs left for --resume")
                    break
                load0, t0 = os.getloadavg()[0], time.time()
                try:
                    p = run_pair(Side("head", engines[c]), base, model, spec, tmp / f"pair-{i}",
                                 warmup=pc.base_warmup_steps, timeout=cfg.engine.timeout_s, rng=rng, label=f"{c} {i}")
                except PairFailed as e:
                    die(f"{c}: pair {i} failed: {e}")
                rec = {"condition": c, "busy": a.busy, "started_first": p.started_first, "warmup": p.warmup,
                       "base_wall": p.base_wall, "head_wall": p.head_wall, "base_cpu": p.base_cpu,
                       "head_cpu": p.head_cpu, "cpus": p.cpus, "other_cpu_pct": p.other_cpu_pct,
                       "load_start": load0, "load_end": os.getloadavg()[0], "seconds": round(time.time() - t0, 2),
                       "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "model": model.name,
                       "arena_mb": spec.arena_mb, "reduced_arena": point.reduced_arena,
                       "settings": a.set,
                       **({"io_delay_ms": a.io_delay_ms, "io_every": a.io_every} if c.startswith("io") else {})}
                with open(recording_path(out, c, a.busy), "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
                print(f"[pairs] {i + 1}/{len(todo)} {c}: head/base x{math.exp(pair_value(rec)):.4f} "
                      f"({rec['seconds']:.0f} s, load {load0:.2f})", flush=True)
    finally:
        if hog:
            hog.kill()
            hog.wait()
    return 0


def analyse(a) -> int:
    pc = settings(a.set).perf
    gate = dict(pairs=pc.base_pairs, step_pairs=pc.base_more_pairs, max_pairs=pc.base_max_pairs,
                alpha=pc.base_alpha, floor=pc.base_floor, min_effect=pc.base_min_effect)
    rows = ["| recording | pairs | median head/base | per-pair noise (sd) | drift rho (p) | DIFFERENT slower "
            "[95 % CI] | SAME | UNKNOWN | pairs/decision (median, mean) | s a pair | pairs' minutes a decision (mean) | "
            "load (median) | p99 verdict fails [95 % CI] |",
            "|---|---:|---:|---:|---|---|---:|---:|---|---:|---:|---:|---|"]
    rng = np.random.default_rng(a.seed)
    for path in sorted(Path(a.out).glob("*.jsonl")):
        recs = read_recording(path)
        if len(recs) < 2:
            continue
        values = [pair_value(r, steps=a.steps) for r in recs]
        pair_s = statistics.fmean(pair_seconds(r, a.steps) for r in recs)
        d = replay(path.stem, values, n=a.decisions, rng=rng, **gate)
        share, lo, hi = d.rate(d.slower)
        rho, p = drift(values)
        steps = [(r["base_wall"][r["warmup"]:][:a.steps], r["head_wall"][r["warmup"]:][:a.steps]) for r in recs]
        fails = replay_p99(steps, n=a.decisions, rng=rng, pairs=pc.base_pairs, limit=pc.p99_max_ratio,
                           alpha=pc.base_alpha)
        f_lo, f_hi = wilson(fails, a.decisions)
        rows.append(f"| {path.stem} | {len(values)} | x{math.exp(statistics.median(values)):.4f} | "
                    f"{100 * statistics.stdev(values):.2f} % | {rho:+.2f} ({p:.2g}) | {100 * share:.2f} % "
                    f"[{100 * lo:.2f}, {100 * hi:.2f}] | {100 * d.same / d.n:.1f} % | {100 * d.unknown / d.n:.1f} % | "
                    f"{statistics.median(d.pairs_used):.0f}, {statistics.fmean(d.pairs_used):.1f} | {pair_s:.0f} | "
                    f"{statistics.fmean(d.pairs_used) * pair_s / 60:.1f} | "
                    f"{statistics.median(r['load_start'] for r in recs):.2f} | {100 * fails / a.decisions:.2f} % "
                    f"[{100 * f_lo:.2f}, {100 * f_hi:.2f}] |")
    print("\n".join(rows))
    if a.shift:
        rows = ["| recording, re-centred to | DIFFERENT slower [95 % CI] | SAME | UNKNOWN | pairs/decision (median, mean) |",
                "|---|---|---:|---:|---|"]
        for name in a.shift_from.split(","):
            values = [pair_value(r, steps=a.steps) for r in read_recording(Path(a.out) / f"{name}.jsonl")]
            centre = statistics.median(values)
            for ratio in (float(x) for x in a.shift.split(",")):
                shifted = [v - centre + math.log(ratio) for v in values]
                d = replay(f"{name} x{ratio:g}", shifted, n=a.decisions, rng=rng, **gate)
                share, lo, hi = d.rate(d.slower)
                rows.append(f"| {name} -> x{ratio:.3f} | {100 * share:.2f} % [{100 * lo:.2f}, {100 * hi:.2f}] | "
                            f"{100 * d.same / d.n:.1f} % | {100 * d.unknown / d.n:.1f} % | "
                            f"{statistics.median(d.pairs_used):.0f}, {statistics.fmean(d.pairs_used):.1f} |")
        print("\nA recording's per-pair noise around another realized ratio (its values moved so their median is "
              "log(ratio)):\n")
        print("\n".join(rows))
    print("\nDecisions in recording order (consecutive pairs, each used once, as --perf-base would have decided):")
    for path in sorted(Path(a.out).glob("*.jsonl")):
        made = in_order([pair_value(r) for r in read_recording(path)], **gate)
        print(f"- {path.stem}: " + (", ".join(f"{v} x{r:.4f} ({k} pairs)" for v, r, k in made) or "none (too few pairs)"))
    print(f"\n{a.decisions} replayed decisions per recording (gate: {gate}); p99 verdicts on {pc.base_pairs} "
          f"pairs each (limit x{pc.p99_max_ratio:g}, tail test at {pc.base_alpha:g}); the intervals are over the "
          f"replays -- the recorded pairs bound the precision.")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="pairs.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--conditions", default="unchanged,slow5")
    r.add_argument("--busy", action="store_true", help="one CPU hog beside the pairs")
    r.add_argument("--pairs", type=int, default=40, help="pairs per condition in the recording")
    r.add_argument("--max-minutes", type=float, default=25.0)
    r.add_argument("--model", default="ci")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an epmci.yaml setting, as `epmci check --set` (repeatable)")
    # ~5 % slower on the ci model here (0.1 ms on every 6th read; any sleep costs a trip through
    # the run queue, so the realized slowdown is measured, not assumed: analyse prints it)
    r.add_argument("--io-delay-ms", type=float, default=0.1)
    r.add_argument("--io-every", type=int, default=6)
    r.add_argument("--seed", type=int)
    r.add_argument("--resume", action="store_true")
    r.add_argument("--out", default=str(REPO / "docs" / "perf-data" / "pairs"))
    n = sub.add_parser("analyse")
    n.add_argument("--decisions", type=int, default=4000)
    n.add_argument("--seed", type=int, default=0)
    n.add_argument("--steps", type=int, metavar="N", help="each pair's value from its first N measured steps only "
                   "(what shorter pairs would have given; default: all it recorded)")
    n.add_argument("--out", default=str(REPO / "docs" / "perf-data" / "pairs"))
    n.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="the gate's settings to replay (perf.min_effect=0.03, ...), as `epmci check --set`")
    n.add_argument("--shift", metavar="RATIOS", help="also replay recordings re-centred on these head/base ratios "
                   "(0.99,0.97: a realized 1 %% and 3 %% slowdown with the recording's own noise)")
    n.add_argument("--shift-from", default="unchanged,unchanged-busy,slow5", metavar="NAMES",
                   help="the recordings --shift re-centres")
    a = ap.parse_args()
    if a.cmd == "record" and (a.pairs < 1 or a.max_minutes <= 0):
        die("--pairs must be >= 1 and --max-minutes > 0")
    return record(a) if a.cmd == "record" else analyse(a)


if __name__ == "__main__":
    sys.exit(main())
