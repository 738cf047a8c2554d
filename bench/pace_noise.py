#!/usr/bin/env python3
"""Where is the timing noise of an unchanged engine against itself: between the steps of one
process pair, or between process pairs? The design of the paced `--perf-base` (steps per
pair, pairs per decision) rests on the answer.

    python bench/pace_noise.py [--pairs 20] [--steps 120] [--warmup 8] [--label NAME] [--out DIR]

Runs `--pairs` paced process pairs of the bundled engine against itself (epmci.perf.paced.run_pair,
the perf suite's baseline scenario on its first prompt), each followed by one ABBA pair of
whole runs of perf.abba_n_predict tokens (today's `--perf-base` sample, for the noise
before), and writes every step time to DIR/NAME.json; then prints:

- per step index: the median step time and the spread of the per-step log-ratios (where
  warm-up ends);
- for N measured steps per pair (the first N after the warm-up): the standard deviation,
  over pairs, of the pair's sample (Hodges-Lehmann, median and mean of its step log-ratios)
  and the part of it the steps' own noise explains (bootstrap of the steps within each
  pair); the rest is between processes;
- the sd of the ABBA pairs' log tok/s ratios.
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

from epmci.compare.stats import hodges_lehmann  # noqa: E402
from epmci.config import load_config, parse_set  # noqa: E402
from epmci.config.experiments import EXPERIMENTS  # noqa: E402
from epmci.contract.process import EngineCommand  # noqa: E402
from epmci.gguf.facts import ModelFacts  # noqa: E402
from epmci.gguf.file import ModelFile  # noqa: E402
from epmci.perf.abba import FIXED_ENV, Side  # noqa: E402
from epmci.perf.measure import measure  # noqa: E402
from epmci.perf.paced import paced_spec, probe, run_pair  # noqa: E402
from epmci.perf.settings import for_model  # noqa: E402
from epmci.synth.store import resolve_model  # noqa: E402

STATS = {"hodges-lehmann": hodges_lehmann, "median": lambda x: float(np.median(x)),
         "mean": lambda x: float(np.mean(x))}


def within_sd(x: np.ndarray, stat, rng: np.random.Generator, n_boot: int = 300) -> float:
    """sd of stat(x) when only the steps are resampled: the within-process part."""
    return float(np.std([stat(x[rng.integers(0, len(x), len(x))]) for _ in range(n_boot)], ddof=1))


def analyse(pairs: list[dict], warmup: int, abba: list[float]) -> str:
    return "\n\n".join(f"## {kind} time\n\n" + analyse_kind(pairs, warmup, kind) for kind in ("wall", "cpu")) + (
        f"\n\nABBA pairs of whole runs: {len(abba)}, sd of log tok/s ratio {np.std(abba, ddof=1):.4f}"
        if len(abba) > 1 else "")


def analyse_kind(pairs: list[dict], warmup: int, kind: str) -> str:
    rng = np.random.default_rng(0)
    lr = [np.log(np.asarray(p[f"base_{kind}"]) / np.asarray(p[f"head_{kind}"])) for p in pairs]
    centres = [float(np.median(x[warmup:])) for x in lr]
    n_all = min(len(x) for x in lr)
    out = ["per step index (all pairs): median base step ms, sd of step log-ratios",
           "| steps | median step ms | sd of log-ratio |", "|---|---:|---:|"]
    for lo in range(0, n_all, max(1, n_all // 12)):
        hi = min(n_all, lo + max(1, n_all // 12))
        t = [x for p in pairs for x in p[f"base_{kind}"][lo:hi]]
        r = [x for v in lr for x in v[lo:hi]]
        out.append(f"| {lo + 1}-{hi} | {1e3 * statistics.median(t):.1f} | {np.std(r, ddof=1):.4f} |")
    meas = [x[warmup:] for x in lr]
    n_max = min(len(x) for x in meas)
    out += ["", f"pair medians: mean {np.mean(centres):+.4f}, se {np.std(centres, ddof=1) / math.sqrt(len(centres)):.4f} "
            "(an A/A comparison: should be 0 within noise)"]
    out += ["", f"{len(pairs)} pairs; sd over pairs of the pair sample (log), and the within-process part "
            "(bootstrap of steps)", "| steps N | statistic | sd over pairs | within | between |",
            "|---:|---|---:|---:|---:|"]
    for n in [x for x in (8, 16, 24, 32, 48, 64, 96, 128, 192) if x <= n_max] + [n_max]:
        for name, stat in STATS.items():
            vals = [stat(x[:n]) for x in meas]
            total = float(np.std(vals, ddof=1))
            within = math.sqrt(statistics.fmean(within_sd(x[:n], stat, rng) ** 2 for x in meas))
            between = math.sqrt(max(0.0, total ** 2 - within ** 2))
            out.append(f"| {n} | {name} | {total:.4f} | {within:.4f} | {between:.4f} |")
    step_sd = float(np.std(np.concatenate(meas), ddof=1))
    first = np.concatenate([np.where(np.array(list(p["step_order"])) == "A", x, -x)[warmup:]
                            for p, x in zip(pairs, lr)])          # log(first stepped / second stepped)
    out += ["", f"per-step log-ratio sd (measured steps, pooled): {step_sd:.4f}; the side stepped first in a "
            f"step pair took exp({np.median(first):+.4f}) times as long as the second (median)"]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=120, help="measured decode steps per process")
    ap.add_argument("--warmup", type=int, default=8, help="paced steps before the measured ones")
    ap.add_argument("--no-abba", action="store_true", help="skip the ABBA pairs")
    ap.add_argument("--compare-pinning", action="store_true",
                    help="every other pair without pinning the engines to the same CPUs (analysed apart)")
    ap.add_argument("--config", default=str(REPO / "epmci.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default=str(REPO / "results"))
    ap.add_argument("--label", default="pace_noise")
    ap.add_argument("--analyse", metavar="JSON", help="only print the analysis of an earlier run")
    a = ap.parse_args()
    if a.analyse:
        d = json.loads(Path(a.analyse).read_text())
        print(report(d))
        return 0

    cfg = load_config(a.config, parse_set(a.set))
    pc = cfg.perf
    model = resolve_model(cfg.model).resolve()
    cfg, _ = for_model(cfg, ModelFile(model))
    facts = ModelFacts.of(ModelFile(model), cfg.run.slot_align)
    fixed = {"n_predict": pc.n_predict, "ctx": pc.ctx, "batch": pc.batch, "threads": cfg.engine.threads,
             "arena_fraction": pc.arena_fraction, "ram_budget_mb": pc.ram_budget_mb}
    spec = EXPERIMENTS[pc.scenarios[0]].spec(pc.prompts[0], fixed, facts)
    pspec = paced_spec(spec, a.warmup, a.steps)
    abba_spec = paced_spec(spec, 0, cfg.perf.abba_n_predict - 1)   # the ABBA fallback's runs
    engine = EngineCommand.from_setting(None)
    base, head = Side("base", engine), Side("head", engine)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"[noise] {model.name}, -n {pspec.n_predict} ({a.warmup} warm-up + {a.steps} measured steps), "
          f"{a.pairs} pairs; {os.cpu_count()} CPUs, load {os.getloadavg()}", flush=True)
    rec = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": str(model), "spec": pspec.settings(),
           "warmup": a.warmup, "steps": a.steps, "pairs": [], "abba_log_ratios": [], "abba_runs": []}
    rng = np.random.default_rng()
    with tempfile.TemporaryDirectory(prefix="epmci-noise-") as td:
        tmp = Path(td)
        for side in (base, head):
            probe(side, model, pspec, tmp, cfg.engine.timeout_s)
        for k in range(a.pairs):
            load = os.getloadavg()[0]
            pin = not (a.compare_pinning and k % 2)
            p = run_pair(head, base, model, pspec, tmp / "pair", warmup=a.warmup, timeout=cfg.engine.timeout_s,
                         rng=rng, label=f"pair {k + 1}", pin=pin)
            rec["pairs"].append({"started_first": p.started_first, "step_order": p.step_order,
                                 "base_wall": p.base_wall, "head_wall": p.head_wall, "base_cpu": p.base_cpu,
                                 "head_cpu": p.head_cpu, "other_cpu_pct": p.other_cpu_pct, "load": load, "cpus": p.cpus,
                                 "seconds": round(p.seconds, 2)})
            msg = f"[noise] pair {k + 1}: HL x{math.exp(p.sample()):.4f} ({p.seconds:.1f} s, load {load:.1f})"
            if not a.no_abba:
                order = ("base", "head") if k % 2 == 0 else ("head", "base")
                got = {s: measure(engine, model, abba_spec, tmp / s, timeout=cfg.engine.timeout_s, env=FIXED_ENV)
                       for s in order}
                if not all(m.ok for m in got.values()):
                    print("[noise] ABBA run failed: " + "; ".join(m.failure or "" for m in got.values()))
                    return 1
                rec["abba_log_ratios"].append(math.log(got["head"].tok_s / got["base"].tok_s))
                rec["abba_runs"].append({s: got[s].tok_s for s in order})
                msg += f"; ABBA x{got['head'].tok_s / got['base'].tok_s:.4f}"
            print(msg, flush=True)
            tmpf = out_dir / f".{a.label}.json.tmp"
            tmpf.write_text(json.dumps(rec, indent=1))
            tmpf.replace(out_dir / f"{a.label}.json")
    print()
    print(report(rec))
    return 0


def report(rec: dict) -> str:
    groups = {"pinned": [p for p in rec["pairs"] if p.get("cpus")],
              "not pinned": [p for p in rec["pairs"] if not p.get("cpus")]}
    return "\n\n".join(f"# {name}: {len(ps)} pairs\n\n" + analyse(ps, rec["warmup"], rec["abba_log_ratios"])
                       for name, ps in groups.items() if len(ps) > 1)


if __name__ == "__main__":
    sys.exit(main())
