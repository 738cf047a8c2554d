#!/usr/bin/env python3
"""How often does `--perf-base` cry wolf, and how often does it catch a real slowdown?

    python bench/perf_gate_calibration.py [--trials 8] [--slowdowns 0.10,0.05] [--out results/]

Runs the paired machinery of `epmci check --perf-base` (epmci.perf.abba.run_abab +
epmci.compare.stats.compare_paired, with the perf settings and thresholds of epmci.yaml) repeatedly:

- unchanged: base and head are the same bundled engine -- every DIFFERENT verdict is a false
  alarm (only a DIFFERENT with ratio < 1 fails the gate);
- slow X%: the head is the bundled engine made X% slower in decode (a wrapper that, after each
  decode step, busy-waits X / (1 - X) times as long as the step took and adds that to the
  decode phase's seconds, so decode tok/s drops by exactly X; a busy wait, not a sleep: sleeps
  overshoot on a loaded box, which made an earlier version of this wrapper ~1.5x too slow)
  -- a DIFFERENT verdict with ratio < 1 is a detection.

Conditions are interleaved trial by trial (unchanged, slow 10%, slow 5%, unchanged, ...) so
the load of a shared machine falls on all of them alike. Each trial is one gate decision:
perf.base_pairs ABBA pairs, UNKNOWN buying two more pairs at a time up to
perf.base_max_pairs, alpha split over those looks. Only the first trial has warm-up runs (numba's cache and the page cache
of its files are warm after that; the model's pages are dropped before every run anyway).

Prints a Markdown table (rates, runs per decision, wall time) and writes the trials as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from epmci.compare.stats import DIFFERENT, SAME, UNKNOWN, per_look_alpha  # noqa: E402
from epmci.config import load_config, parse_set  # noqa: E402
from epmci.config.experiments import EXPERIMENTS  # noqa: E402
from epmci.contract.process import EngineCommand  # noqa: E402
from epmci.gguf.facts import ModelFacts  # noqa: E402
from epmci.gguf.file import ModelFile  # noqa: E402
from epmci.perf.abba import Side, run_abab  # noqa: E402
from epmci.synth.store import resolve_model  # noqa: E402

SLOW_WRAPPER = """
import sys, time
import engine.cli, engine.runtime as R
SLOW = {factor!r}          # extra decode time, relative to the decode step itself
_eval = R.Engine.eval
def eval(self, tokens, phase="prefill"):
    t0 = time.perf_counter()
    out = _eval(self, tokens, phase)
    if phase == "decode":
        extra = (time.perf_counter() - t0) * SLOW
        end = time.perf_counter() + extra
        while time.perf_counter() < end:   # busy: a compute regression, exact to microseconds
            pass
        self._phase("decode").seconds += extra
    return out
R.Engine.eval = eval
sys.exit(engine.cli.main())
"""


def slowed_engine(tmp: Path, slowdown: float) -> EngineCommand:
    p = tmp / f"slow_{int(round(slowdown * 1000))}.py"
    p.write_text(textwrap.dedent(SLOW_WRAPPER.format(factor=slowdown / (1 - slowdown))))
    return EngineCommand((sys.executable, str(p)), False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8, help="trials per condition")
    ap.add_argument("--slowdowns", default="0.10,0.05", help="decode tok/s reductions of the slowed heads")
    ap.add_argument("--config", default=str(REPO / "epmci.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a setting, e.g. --set perf.paired_test=sign --set perf.base_n_predict=16")
    ap.add_argument("--model", help="default: the config's model (ci)")
    ap.add_argument("--out", default=str(REPO / "results"))
    ap.add_argument("--label", default="perf_gate_calibration", help="output file name (JSON)")
    a = ap.parse_args()

    cfg = load_config(a.config, parse_set(a.set))
    pc = cfg.perf
    model = resolve_model(a.model or cfg.model).resolve()
    facts = ModelFacts.of(ModelFile(model), cfg.run.slot_align)
    fixed = {"n_predict": pc.base_n_predict, "ctx": pc.ctx, "batch": pc.batch, "threads": cfg.engine.threads,
             "arena_fraction": pc.arena_fraction, "ram_budget_mb": pc.ram_budget_mb}
    spec = EXPERIMENTS[pc.scenarios[0]].spec(pc.prompts[0], fixed, facts)
    bundled = EngineCommand.from_setting(None)
    slowdowns = [float(x) for x in a.slowdowns.split(",") if x.strip()]
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"[calib] model {model}; scenario {pc.scenarios[0]}, prompt {pc.prompts[0]!r}, -n {pc.base_n_predict}, "
          f"-b {pc.batch}, arena {spec.arena_mb:.2f} MiB; pairs {pc.base_pairs}..{pc.base_max_pairs}, "
          f"{pc.paired_test} test, alpha {pc.alpha} ({per_look_alpha(pc.alpha, pc.base_pairs, pc.base_max_pairs):.3g} "
          f"per look), min effect {pc.min_effect:.0%}; {a.trials} trials x "
          f"{1 + len(slowdowns)} conditions; {os.cpu_count()} CPUs, load {os.getloadavg()}", flush=True)
    trials = []
    with tempfile.TemporaryDirectory(prefix="epmci-calib-") as td:
        tmp = Path(td)
        conditions = [("unchanged", 0.0, bundled)] + [(f"slow {s:.0%}", s, slowed_engine(tmp, s)) for s in slowdowns]
        first = True
        for t in range(a.trials):
            for name, s, head_cmd in conditions:
                load0 = os.getloadavg()[0]
                t0 = time.time()
                res = run_abab(Side("head", head_cmd), Side("base", bundled), model, spec, tmp / "runs",
                               pairs=pc.base_pairs, max_pairs=pc.base_max_pairs, alpha=pc.alpha,
                               min_effect=pc.min_effect, timeout=cfg.engine.timeout_s, warmup=first,
                               test=pc.paired_test)
                first = False
                wall = time.time() - t0
                if res.failure:
                    print(f"[calib] {name} trial {t + 1}: FAILED: {res.failure}", flush=True)
                    return 2
                c = res.comparison
                rec = {"condition": name, "slowdown": s, "trial": t + 1, "verdict": c.verdict,
                       "ratio": c.ratio, "ci": list(c.ci), "p_value": c.p_value, "pairs": res.pairs,
                       "runs": len(res.order), "wall_s": round(wall, 1), "load_start": load0,
                       "load_end": os.getloadavg()[0], "base": res.base, "head": res.head,
                       "outputs_equal": res.base_first.fingerprint() == res.head_first.fingerprint()}
                trials.append(rec)
                print(f"[calib] {name:>9} trial {t + 1}/{a.trials}: {c.verdict:<9} x{c.ratio:.3f} "
                      f"[{c.ci[0]:.3f}, {c.ci[1]:.3f}] p={c.p_value:.3g} pairs {res.pairs} "
                      f"({wall:.0f} s, load {load0:.1f})", flush=True)
                (out_dir / f"{a.label}.json").write_text(json.dumps(
                    {"config": a.config, "overrides": a.set, "model": str(model), "spec": spec.settings(),
                     "test": pc.paired_test, "pairs": [pc.base_pairs, pc.base_max_pairs], "alpha": pc.alpha,
                     "alpha_per_look": per_look_alpha(pc.alpha, pc.base_pairs, pc.base_max_pairs),
                     "trials": trials}, indent=1))
    print()
    print(summary(trials, pc))
    return 0


def summary(trials: list[dict], pc) -> str:
    lines = ["| condition | trials | fails the gate (DIFFERENT, slower) | DIFFERENT, faster | SAME | UNKNOWN "
             "| pairs per decision (median, max) | runs per decision (mean) | minutes per decision (mean) "
             "| median paired ratio |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in dict.fromkeys(t["condition"] for t in trials):
        ts = [t for t in trials if t["condition"] == name]
        n = len(ts)
        slower = sum(t["verdict"] == DIFFERENT and t["ratio"] < 1 for t in ts)
        faster = sum(t["verdict"] == DIFFERENT and t["ratio"] >= 1 for t in ts)
        same = sum(t["verdict"] == SAME for t in ts)
        unk = sum(t["verdict"] == UNKNOWN for t in ts)
        pairs = [t["pairs"] for t in ts]
        lines.append(f"| {name} | {n} | {slower}/{n} ({slower / n:.0%}) | {faster}/{n} | {same}/{n} | {unk}/{n} "
                     f"| {statistics.median(pairs):g}, {max(pairs)} | {statistics.mean(t['runs'] for t in ts):.1f} "
                     f"| {statistics.mean(t['wall_s'] for t in ts) / 60:.1f} "
                     f"| {statistics.median(t['ratio'] for t in ts):.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
