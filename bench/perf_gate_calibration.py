#!/usr/bin/env python3
"""How often does `--perf-base` cry wolf, and how often does it catch a real slowdown?

    python bench/perf_gate_calibration.py [--counts unchanged=100,slow5=50,slow10=50,io5=30]
        [--abba N] [--golden N] [--io-delay-ms D] [--label NAME] [--out DIR] [--resume]

Runs the machinery of `epmci check --perf-base` with the settings of epmci.yaml over and over
on the ci model, one gate decision per trial:

- paced decisions (epmci.perf.paced.run_paced, probes included, as the gate runs them):
  - `unchanged`: base and head are the same bundled engine -- a DIFFERENT-and-slower verdict
    (or a p99 latency failure) is a false alarm;
  - `slowX`: the head made X % slower in compute: after each decode step it spins on the CPU
    for X / (100 - X) times the step's own CPU time, so X % more of its time is compute
    (by CPU time, not wall time: a spin timed by the wall clock is preempted on a loaded
    box, overshoots, and made "5 %" 13 % in the first trials; a sleep overshoots more);
  - `fixedX`: the same spin, but a constant amount per step (X / (100 - X) times the median
    CPU time of its first 4 decode steps, the paced warm-up): a cost that does not move with
    each step's own noise, as a code change's would not;
  - `ioX`: the head's expert reads slowed: issuing every `--io-every`-th expert read
    (ExpertIO.submit, the read path of engine/paging/expert_io.py) first sleeps
    `--io-delay-ms` on the issuing thread -- waiting, not compute. On a loaded box any sleep
    costs a trip through the run queue, so even a 10 us sleep on every read made the engine
    12 % slower; every third read is about 5 %. (A sleep in the reader threads instead costs
    the Python engine CPU time too: each wake-up takes the GIL back from the compute.) X only
    names the condition; the realized slowdown is measured (the median ratio of its trials);
- `--abba N`: N decisions of today's fallback (whole-run ABBA, unchanged engine) for the noise
  before;
- `--golden N`: N decisions of the unpaired golden comparison per condition unchanged, slow5,
  slow10 (perf.repeats timed runs up to perf.max_repeats, Mann-Whitney against a baseline of
  perf.repeats runs recorded at the start of the calibration: a cross-time comparison, as
  golden files are).

Slow heads are wrapper scripts that monkeypatch a copy of the engine; nothing in the engine
knows about them. Trials of all conditions are interleaved evenly (each condition spread
over the whole run), so the shared machine's load falls on all of them alike. Every trial is
appended to DIR/NAME.json as it finishes (atomically); --resume continues a stopped run.
Prints a Markdown table at the end (also: --summary JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from epmci.compare.stats import (DIFFERENT, SAME, UNKNOWN, compare_samples, latency_percentiles,  # noqa: E402
                                 per_look_alpha)
from epmci.config import load_config, parse_set  # noqa: E402
from epmci.contract.capabilities import probe  # noqa: E402
from epmci.contract.process import EngineCommand  # noqa: E402
from epmci.perf.abba import FIXED_ENV, Side, run_abab  # noqa: E402
from epmci.perf.measure import measure  # noqa: E402
from epmci.perf.paced import paced_spec, run_paced  # noqa: E402
from epmci.perf.plan import timed_scenario  # noqa: E402
from epmci.synth.store import resolve_model  # noqa: E402

COMPUTE_WRAPPER = """
import sys, time
sys.modules.setdefault("scipy.linalg", None)   # as `python -m engine` does (engine/__main__.py)
import engine.cli, engine.runtime as R
SLOW = {factor!r}          # extra decode work, relative to the CPU time of the decode step itself
_eval = R.Engine.eval
def eval(self, tokens, phase="prefill", *args, **kw):
    c0 = time.process_time()
    out = _eval(self, tokens, phase, *args, **kw)
    if phase == "decode":
        t1 = time.perf_counter()
        end = time.process_time() + (time.process_time() - c0) * SLOW
        while time.process_time() < end:   # busy on the CPU: more compute, as contended as the step's own
            pass
        self._phase("decode").seconds += time.perf_counter() - t1
    return out
R.Engine.eval = eval
sys.exit(engine.cli.main())
"""

# The same extra compute, but a constant amount per step and inside it: the median CPU time
# of the first CALIBRATE decode steps (the paced warm-up) times X / (100 - X), spun at the
# start of every later step -- a cost that does not move with each step's own noise, as a
# code change's. (Spun after the step instead, it made the head 1-3 % *faster* on this VM:
# a vCPU kept busy wakes the next step sooner, so a spin that extends the step's idle-free
# tail is not a slowdown a code change would cause.)
FIXED_WRAPPER = """
import statistics, sys, time
sys.modules.setdefault("scipy.linalg", None)   # as `python -m engine` does (engine/__main__.py)
import engine.cli, engine.runtime as R
SLOW, CALIBRATE = {factor!r}, 4
_eval, _seen = R.Engine.eval, []
def eval(self, tokens, phase="prefill", *args, **kw):
    if phase != "decode":
        return _eval(self, tokens, phase, *args, **kw)
    if len(_seen) < CALIBRATE:
        c0 = time.process_time()
        out = _eval(self, tokens, phase, *args, **kw)
        _seen.append(time.process_time() - c0)
        return out
    t1 = time.perf_counter()
    end = time.process_time() + statistics.median(_seen) * SLOW
    while time.process_time() < end:
        pass
    spun = time.perf_counter() - t1
    out = _eval(self, tokens, phase, *args, **kw)
    self._phase("decode").seconds += spun
    return out
R.Engine.eval = eval
sys.exit(engine.cli.main())
"""

IO_WRAPPER = """
import itertools, sys, time
sys.modules.setdefault("scipy.linalg", None)   # as `python -m engine` does (engine/__main__.py)
import engine.cli
from engine.paging import expert_io
DELAY, EVERY = {delay!r}, {every!r}   # seconds of extra latency on every EVERY-th expert read
_submit = expert_io.ExpertIO.submit
_reads = itertools.count(1)
def submit(self, ranges, *args, **kw):
    if next(_reads) % EVERY == 0:
        time.sleep(DELAY)  # on the thread that issues the read: the pager waits, the CPU does not work
    return _submit(self, ranges, *args, **kw)
expert_io.ExpertIO.submit = submit
sys.exit(engine.cli.main())
"""


def declared(engine: EngineCommand, timeout: float) -> EngineCommand:
    """`engine` with the features its --contract-info declares (pacing among them), as a check has it."""
    caps, why = probe(engine, timeout)
    if caps is None:
        raise SystemExit(f"calibration: {why}")
    return engine.with_features(caps.features)


def wrapper(tmp: Path, name: str, text: str) -> EngineCommand:
    p = tmp / f"{name}.py"
    p.write_text(textwrap.dedent(text))
    return EngineCommand((sys.executable, str(p)), False)


def heads(tmp: Path, names: list[str], io_delay_s: float, io_every: int) -> dict[str, EngineCommand]:
    out = {}
    for name in names:
        if name == "unchanged":
            out[name] = EngineCommand.from_setting(None)
        elif name.startswith("slow"):
            x = float(name[4:]) / 100
            out[name] = wrapper(tmp, name, COMPUTE_WRAPPER.format(factor=x / (1 - x)))
        elif name.startswith("fixed"):
            x = float(name[5:]) / 100
            out[name] = wrapper(tmp, name, FIXED_WRAPPER.format(factor=x / (1 - x)))
        elif name.startswith("io"):
            out[name] = wrapper(tmp, name, IO_WRAPPER.format(delay=io_delay_s, every=io_every))
        else:
            raise SystemExit(f"unknown condition {name!r} (unchanged, slowX, fixedX, ioX)")
    return out


def interleave(counts: dict[str, int], done: dict[str, int]) -> list[str]:
    """The remaining trials, each condition spread evenly over the run."""
    keyed = [((k + 0.5) / n, i, name) for i, (name, n) in enumerate(counts.items()) for k in range(done.get(name, 0), n)]
    return [name for _, _, name in sorted(keyed)]


def pooled_sd(groups: list[list[float]]) -> float | None:
    """sd of values around their group's mean, pooled over groups (ddof per group)."""
    ss = sum(float(np.sum((np.asarray(g) - np.mean(g)) ** 2)) for g in groups if len(g) > 1)
    df = sum(len(g) - 1 for g in groups if len(g) > 1)
    return math.sqrt(ss / df) if df else None


def paced_trial(cfg, model, spec, head: EngineCommand, base: EngineCommand, tmp: Path) -> dict:
    pc = cfg.perf
    res = run_paced(Side("head", head), Side("base", base), model, paced_spec(spec, pc.base_warmup_steps, pc.base_steps),
                    tmp / "paced", pairs=pc.base_pairs, max_pairs=pc.base_max_pairs, step_pairs=pc.base_more_pairs,
                    warmup=pc.base_warmup_steps, alpha=pc.base_alpha, floor=pc.base_floor, min_effect=pc.base_min_effect,
                    timeout=cfg.engine.timeout_s)
    if res.failure:
        raise SystemExit(f"[calib] paced decision failed: {res.failure}")
    c = res.comparison
    lat = {s: latency_percentiles(res.latencies(s)) for s in ("base", "head")}
    p99 = lat["head"]["p99"] / lat["base"]["p99"]
    return {"kind": "paced", "verdict": c.verdict, "ratio": c.ratio, "ci": list(c.ci), "p_value": c.p_value,
            "pairs": res.n_pairs, "samples": res.samples(), "cpu_samples": res.samples("cpu"),
            "cpu_ratio": res.cpu_ratio, "p99_ratio": p99, "p99_fail": p99 > pc.p99_max_ratio,
            "latency_ms": {s: {q: round(1e3 * v, 3) for q, v in lat[s].items()} for s in lat},
            "other_cpu_pct": [p.other_cpu_pct for p in res.pairs], "seed": res.seed,
            "outputs_equal": res.first.base.fingerprint() == res.first.head.fingerprint(),
            "runs": 2 * res.n_pairs + 2}


def abba_trial(cfg, model, spec, engine: EngineCommand, tmp: Path) -> dict:
    pc = cfg.perf
    res = run_abab(Side("head", engine), Side("base", engine), model, paced_spec(spec, 0, pc.abba_n_predict - 1),
                   tmp / "abba", pairs=pc.abba_pairs, max_pairs=pc.abba_max_pairs, alpha=pc.alpha,
                   min_effect=pc.min_effect, timeout=cfg.engine.timeout_s, test=pc.paired_test)
    if res.failure:
        raise SystemExit(f"[calib] ABBA decision failed: {res.failure}")
    c = res.comparison
    return {"kind": "abba", "verdict": c.verdict, "ratio": c.ratio, "ci": list(c.ci), "p_value": c.p_value,
            "pairs": res.pairs, "samples": [math.log(h / b) for b, h in zip(res.base, res.head)],
            "runs": len(res.order) + 2}


def golden_trial(cfg, model, spec, engine: EngineCommand, baseline: list[float], tmp: Path) -> dict:
    pc = cfg.perf
    alpha = per_look_alpha(pc.alpha, pc.repeats, pc.max_repeats)
    cur = []

    def timed() -> None:
        m = measure(engine, model, spec, tmp / "golden", timeout=cfg.engine.timeout_s, env=FIXED_ENV)
        if not m.ok:
            raise SystemExit(f"[calib] golden run failed: {m.failure}")
        cur.append(m.tok_s)

    for _ in range(pc.repeats):
        timed()
    c = compare_samples(baseline, cur, alpha, pc.min_effect)
    while c.verdict == UNKNOWN and len(cur) < pc.max_repeats:
        for _ in range(min(2, pc.max_repeats - len(cur))):
            timed()
        c = compare_samples(baseline, cur, alpha, pc.min_effect)
    return {"kind": "golden", "verdict": c.verdict, "ratio": c.ratio, "ci": list(c.ci), "p_value": c.p_value,
            "pairs": len(cur), "samples": cur, "runs": len(cur)}


def summary(trials: list[dict]) -> str:
    lines = ["| gate | condition | decisions | fails the gate (DIFFERENT, slower) | DIFFERENT, faster | SAME | UNKNOWN "
             "| p99 fails | pairs per decision (median, max) | minutes per decision (median, mean) "
             "| median ratio (CPU) | per-pair noise (sd of log-ratio) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kind, name in dict.fromkeys((t["kind"], t["condition"]) for t in trials):
        ts = [t for t in trials if t["kind"] == kind and t["condition"] == name]
        n = len(ts)
        slower = sum(t["verdict"] == DIFFERENT and t["ratio"] < 1 for t in ts)
        faster = sum(t["verdict"] == DIFFERENT and t["ratio"] >= 1 for t in ts)
        same = sum(t["verdict"] == SAME for t in ts)
        unk = sum(t["verdict"] == UNKNOWN for t in ts)
        p99 = f"{sum(t['p99_fail'] for t in ts)}/{n}" if kind == "paced" else ""
        pairs = [t["pairs"] for t in ts]
        mins = [t["wall_s"] / 60 for t in ts]
        cpu = f" ({statistics.median(t['cpu_ratio'] for t in ts):.3f})" if kind == "paced" else ""
        noise = pooled_sd([t["samples"] for t in ts]) if kind != "golden" else None
        lines.append(f"| {kind} | {name} | {n} | {slower}/{n} ({slower / n:.0%}) | {faster}/{n} | {same}/{n} | "
                     f"{unk}/{n} | {p99} | {statistics.median(pairs):g}, {max(pairs)} | "
                     f"{statistics.median(mins):.2f}, {statistics.mean(mins):.2f} | "
                     f"{statistics.median(t['ratio'] for t in ts):.3f}{cpu} | "
                     f"{'' if noise is None else f'{noise:.4f}'} |")
    return "\n".join(lines)


def parse_counts(text: str) -> dict[str, int]:
    out = {}
    for item in text.split(","):
        name, _, n = item.partition("=")
        out[name.strip()] = int(n)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="unchanged=100,slow5=50,slow10=50,io5=30",
                    help="paced decisions per condition (unchanged, slowX: X %% slower compute, ioX: slow reads)")
    ap.add_argument("--abba", type=int, default=0, help="ABBA decisions of the unchanged engine (the noise before)")
    ap.add_argument("--golden", type=int, default=0, help="golden-comparison decisions per condition unchanged, "
                                                           "slow5, slow10")
    ap.add_argument("--io-delay-ms", type=float, default=0.01, help="extra latency of an expert read of the io heads")
    ap.add_argument("--io-every", type=int, default=3, help="the io heads delay every N-th expert read")
    ap.add_argument("--config", default=str(REPO / "epmci.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    ap.add_argument("--model", help="default: the config's model (ci)")
    ap.add_argument("--out", default=str(REPO / "results"))
    ap.add_argument("--label", default="perf_gate_calibration", help="output file name (JSON)")
    ap.add_argument("--resume", action="store_true", help="continue the trials of an existing DIR/NAME.json")
    ap.add_argument("--summary", metavar="JSON", help="only print the table of an earlier run")
    a = ap.parse_args()
    if a.summary:
        print(summary(json.loads(Path(a.summary).read_text())["trials"]))
        return 0

    cfg = load_config(a.config, parse_set(a.set))
    model = resolve_model(a.model or cfg.model).resolve()
    cfg, _, spec = timed_scenario(cfg, model, cfg.perf.scenarios[0])
    pc = cfg.perf
    counts = parse_counts(a.counts)
    plan = {("paced", k): n for k, n in counts.items()}
    if a.abba:
        plan[("abba", "unchanged")] = a.abba
    for k in ("unchanged", "slow5", "slow10") if a.golden else ():
        plan[("golden", k)] = a.golden
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{a.label}.json"
    rec = {"date": time.strftime("%Y-%m-%d %H:%M"), "config": a.config, "overrides": a.set, "model": str(model),
           "spec": spec.settings(), "settings": {k: getattr(pc, k) for k in (
               "base_pairs", "base_more_pairs", "base_max_pairs", "base_steps", "base_warmup_steps", "base_alpha", "base_floor",
               "min_effect", "p99_max_ratio", "alpha", "abba_pairs", "abba_max_pairs", "abba_n_predict",
               "paired_test", "repeats", "max_repeats", "n_predict")},
           "io_delay_ms": a.io_delay_ms, "io_every": a.io_every, "cpus": os.cpu_count(), "golden_baseline": None, "trials": []}
    if a.resume and path.exists():
        rec = json.loads(path.read_text())
    done: dict = {}
    for t in rec["trials"]:
        done[(t["kind"], t["condition"])] = done.get((t["kind"], t["condition"]), 0) + 1
    todo = interleave({f"{k}|{c}": n for (k, c), n in plan.items()}, {f"{k}|{c}": n for (k, c), n in done.items()})
    print(f"[calib] {model.name}, scenario {pc.scenarios[0]}; paced {pc.base_pairs}..{pc.base_max_pairs} pairs x "
          f"{pc.base_steps} steps (+{pc.base_warmup_steps} warm-up), alpha {pc.base_alpha} one-sided; "
          f"{len(todo)} decisions to go ({len(rec['trials'])} done); {os.cpu_count()} CPUs, load {os.getloadavg()}",
          flush=True)
    bundled = EngineCommand.from_setting(None)
    with tempfile.TemporaryDirectory(prefix="epmci-calib-") as td:
        tmp = Path(td)
        engines = {name: declared(e, cfg.engine.timeout_s)
                   for name, e in heads(tmp, sorted({c for _, c in plan}), a.io_delay_ms / 1e3, a.io_every).items()}
        if a.golden and rec["golden_baseline"] is None:
            base_runs = [measure(bundled, model, spec, tmp / "gb", timeout=cfg.engine.timeout_s, env=FIXED_ENV)
                         for _ in range(pc.repeats + 1)][1:]          # the first run warms up
            rec["golden_baseline"] = [m.tok_s for m in base_runs]
        for i, key in enumerate(todo):
            kind, name = key.split("|")
            load0, t0 = os.getloadavg()[0], time.time()
            if kind == "paced":
                t = paced_trial(cfg, model, spec, engines[name], bundled, tmp)
            elif kind == "abba":
                t = abba_trial(cfg, model, spec, bundled, tmp)
            else:
                t = golden_trial(cfg, model, spec, engines[name], rec["golden_baseline"], tmp)
            t.update(condition=name, wall_s=round(time.time() - t0, 1), load_start=load0, load_end=os.getloadavg()[0],
                     finished=time.strftime("%Y-%m-%d %H:%M:%S"))
            rec["trials"].append(t)
            extra = (f" CPU x{t['cpu_ratio']:.3f} p99 x{t['p99_ratio']:.2f}" if kind == "paced" else "")
            print(f"[calib] {i + 1}/{len(todo)} {kind} {name:>9}: {t['verdict']:<9} x{t['ratio']:.3f} "
                  f"[{t['ci'][0]:.3f}, {t['ci'][1]:.3f}] p={t['p_value']:.3g} pairs {t['pairs']}{extra} "
                  f"({t['wall_s']:.0f} s, load {load0:.1f})", flush=True)
            tmpf = path.with_suffix(".json.tmp")
            tmpf.write_text(json.dumps(rec, indent=1))
            tmpf.replace(path)
    print()
    print(summary(rec["trials"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
