#!/usr/bin/env python3
"""The fault x shape table: every fault of the project's fault set (tests/faults.py), injected
into a copy of the bundled engine, checked with `epmci check --fast` on generated valid models
(epmci/synth/shapes.py), none of them a preset and none with a golden baseline.

    python bench/fault_shapes.py [--seeds 0-19] [--faults 'NAME;NAME'] [--resume] [--max-minutes 25]
                                 [--out docs/perf-data/fault-shapes.jsonl] [--table docs/fault-shapes.md]
    python bench/fault_shapes.py --render [--out ...] [--table ...]

A cell is one broken copy on one shape:
- caught: the check fails (exit 1), blaming the engine;
- ERROR: the check exits 2 or writes no report: it blamed itself for an engine's defect;
- when the check passes, the broken copy and the correct engine are run through the probe (below)
  and compared: if every probe run gives the same exit, logits, stats counters and dumps (and
  peak RSS within noise), the shape cannot expose the fault ("cannot", with what the fault needs);
  otherwise the gate MISSED it, naming the first probe run that differs.
A fault that patches the code of another architecture is "cannot" without a run.

The probe is this script's own set of engine runs -- every contract switch, the thread counts
1-3, micro-batches 1 and 3, each kernel path, a tight arena and a long decode -- chosen here,
not by the gate's plan, so a run the plan leaves out shows as MISSED rather than as "cannot".

Every cell is appended to --out as it finishes; --resume continues with the cells not yet in it,
--max-minutes ends a chunk between cells (no job here may run longer than 30 minutes).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from engine.kernels import available_paths  # noqa: E402
from epmci.config.schema import CheckConfig  # noqa: E402
from epmci.fsutil import atomic_write  # noqa: E402
from epmci.gguf.facts import ModelFacts  # noqa: E402
from epmci.gguf.file import ModelFile  # noqa: E402
from epmci.perf.machine import current_commit  # noqa: E402
from epmci.synth.shapes import shape  # noqa: E402
from epmci.synth.store import shape_model  # noqa: E402
from epmci.units import arena_mib  # noqa: E402
from faults import FAULT_SET, broken_engine  # noqa: E402
from shapes import append, describe, recorded, recorded_at, seeds, shape_text, sweep_arguments  # noqa: E402

CHECK_TIMEOUT_S = 10 * 60
RUN_TIMEOUT_S = 120
PROMPT = ("The pager reads each routed expert from the file into a slot of the arena, "
          "and the prefetcher guesses the next layer's experts before they are needed.")
# stats fields measured, not counted (time, and memory that includes the interpreter a broken
# copy loads more of): peak RSS is compared with noise in mind, the others not at all
MEASURED = {"seconds", "tok_s", "io_wait_s", "peak_rss_mb", "vm_swap_mb", "ram_need_mb"}
RSS_NOISE_MB = 16.0        # and 10 %: what peak RSS moves between two runs of one engine


def probe_runs(facts: ModelFacts) -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, flags, env) of every probe run; the arena of the tight runs is the contract's
    minimum for their micro-batch plus two slots, so the policy evicts every token."""
    def tight(batch: int) -> str:
        return f"{arena_mib(facts.min_arena_bytes(batch, uniform=False, margin_slots=2)):.6f}"
    runs = [("default", [], {}), ("-t 1", ["-t", "1"], {}), ("-t 3", ["-t", "3"], {}),
            ("-b 1", ["-b", "1"], {}), ("-b 3", ["-b", "3"], {}), ("resident", ["--no-pager"], {}),
            ("tight, layer-ahead 1, queue 1, stale 0", ["-b", "4"],
             {"SDQ_ARENA_MB": tight(4), "SDQ_PREFETCH_QUEUE": "1", "SDQ_PREFETCH_STALE_TOKENS": "0"}),
            ("tight, layer-ahead 2, queue 2", ["-b", "4"],
             {"SDQ_ARENA_MB": tight(4), "SDQ_PREFETCH_LAYER_AHEAD": "2", "SDQ_PREFETCH_QUEUE": "2"}),
            ("tight, layer-ahead 0", ["-b", "4"], {"SDQ_ARENA_MB": tight(4), "SDQ_PREFETCH_LAYER_AHEAD": "0"}),
            ("tight, uniform slots", ["-b", "4"], {"SDQ_ARENA_MB": tight(4), "SDQ_FORCE_UNIFORM_SLOT": "1"}),
            ("tight, no prefetch", ["-b", "4", "--no-prefetch"], {"SDQ_ARENA_MB": tight(4)}),
            ("admit 2, -b 1", ["-b", "1"], {"SDQ_ARENA_MB": tight(1), "SDQ_ADMIT_MIN_HITS": "2"}),
            ("serial reads, 1 reader, fadvise", [],
             {"SDQ_IO_PARALLEL": "0", "SDQ_IO_THREADS": "1", "SDQ_FADV_DONTNEED": "1"}),
            ("exact reads", ["-b", "3"], {"SDQ_ARENA_MB": tight(3), "SDQ_DIRECT_IO": "0"}),
            ("hot pins, uniform slots", [], {"SDQ_HOT_PIN": "8", "SDQ_FORCE_UNIFORM_SLOT": "1"}),
            ("long decode", ["-n", "96", "-c", "512"], {})]
    return runs + [(f"kernels {p}", ["--kernels", p], {}) for p in available_paths()]


ENV = {**os.environ, "PYTHONPATH": str(REPO)}     # the broken copies import engine/ from this tree


def probe(engine: list[str], model: Path, facts: ModelFacts, work: Path) -> dict[str, dict]:
    """Each probe run's exit, logits, stats (timing left out) and dumps, as digests."""
    out: dict[str, dict] = {}
    profile = work / "profile.bin"
    for name, flags, env in probe_runs(facts):
        d = work / name.replace(" ", "_").replace(",", "")
        d.mkdir(parents=True)
        env = {**ENV, **env, "SDQ_MOE_DUMP": str(d / "moe"), "SDQ_PREFETCH_DUMP": str(d / "prefetch.dump")}
        if "SDQ_HOT_PIN" in env:
            env["SDQ_PROFILE_IN"] = str(profile)
        argv = [*engine, "-m", str(model), "-p", PROMPT, "--no-chat", "-n", "10", "-c", "256", "--dump-logits",
                "--logits-out", str(d / "logits.bin"), "--stats-file", str(d / "stats.jsonl"), *flags]
        if name == "default":
            argv += ["--profile-out", str(profile)]
        try:
            proc = subprocess.run(argv, env=env, cwd=d, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            rc, err = proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            rc, err = None, f"timed out after {RUN_TIMEOUT_S} s"
        stats = [json.loads(line) for line in (d / "stats.jsonl").read_text().splitlines()] \
            if (d / "stats.jsonl").exists() else []
        dumps = {f.name: hashlib.sha256(f.read_bytes()).hexdigest()[:16] for f in sorted(d.iterdir())
                 if f.name.startswith(("moe", "prefetch", "logits"))}
        out[name] = {"exit": rc, "error": err if rc else "", "dumps": dumps,
                     "stats": [{k: v for k, v in r.items() if k not in MEASURED} for r in stats],
                     "peak_rss_mb": max((r.get("peak_rss_mb", 0.0) for r in stats), default=0.0)}
    return out


def difference(correct: dict[str, dict], broken: dict[str, dict]) -> str | None:
    """The first probe run in which the broken copy behaves otherwise, and how; None if none does."""
    for name, want in correct.items():
        got = broken.get(name)
        if got is None:
            return f"{name}: not run"
        if got["exit"] != want["exit"]:
            return f"{name}: exit {got['exit']} ({got['error']}), the correct engine's {want['exit']}"
        for f in sorted(set(want["dumps"]) | set(got["dumps"])):
            if want["dumps"].get(f) != got["dumps"].get(f):
                return f"{name}: {f} differs"
        for w, g in zip(want["stats"], got["stats"]):
            changed = sorted(k for k in set(w) | set(g) if w.get(k) != g.get(k))
            if changed:
                return f"{name}: {w.get('phase')} stats differ in " + ", ".join(
                    f"{k} {g.get(k)} (correct {w.get(k)})" for k in changed[:4])
        if len(want["stats"]) != len(got["stats"]):
            return f"{name}: {len(got['stats'])} stats records, the correct engine's {len(want['stats'])}"
        a, b = got["peak_rss_mb"], want["peak_rss_mb"]
        if abs(a - b) > max(RSS_NOISE_MB, 0.1 * b):
            return f"{name}: peak RSS {a:.0f} MiB, the correct engine's {b:.0f} MiB"
    return None


def check(engine_cmd: str, model: Path, work: Path) -> tuple[int | None, list[str], str]:
    """`epmci check --fast` of the broken copy: exit code, its failures, its tool error."""
    report = work / "report.json"
    try:
        # --fail-fast: exit 1 at the first failure is the verdict the cell needs, in a fraction of the time
        proc = subprocess.Popen([sys.executable, "-m", "epmci", "check", "--fast", "--fail-fast", "--quiet",
                                 "--model", str(model), "--engine-cmd", engine_cmd, "--json", str(report),
                                 "--workdir", str(work / "check")],
                                cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rc = proc.wait(timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()        # SIGTERM: epmci kills the engines it started (their own sessions) and exits
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return None, [], f"timed out after {CHECK_TIMEOUT_S} s"
    data = json.loads(report.read_text()) if report.exists() else {}
    failed = [f"{s['name']} / {r['name']}" for s in data.get("suites", []) for r in s["results"]
              if r["status"] in ("fail", "error")]
    return rc, failed, data.get("tool_error") or ("" if data else "no report written")


class Cells:
    """The correct engine's probe of each shape, made once and only when a check passes."""

    def __init__(self):
        self.correct: dict[int, dict] = {}

    def run(self, seed: int, fault: str) -> dict:
        p, f = shape(seed), FAULT_SET[fault]
        t0 = time.monotonic()
        rec = {"seed": seed, "shape": describe(p), "fault": fault, "kind": f.kind}
        if f.arch and f.arch != p.arch:
            verdict, why, failed, rc = "cannot", f"it patches {f.arch} code; a {p.arch} model runs none of it", [], None
        else:
            model = shape_model(seed)
            with tempfile.TemporaryDirectory(prefix="epmci-fault-shape-") as tmp:
                work = Path(tmp)
                cmd = broken_engine(work, f.patch)
                loads = subprocess.run([*shlex.split(cmd), "--contract-info"], env=ENV, capture_output=True, text=True)
                rc, failed, tool_error = (loads.returncode, [], "") if loads.returncode else check(cmd, model, work)
                if loads.returncode:            # a patch that no longer fits the engine is no fault at all
                    verdict, why = "ERROR", "the broken copy does not start: " + loads.stderr.strip()[-300:]
                elif rc == 1 and not tool_error:
                    verdict, why = "caught", ""
                elif rc != 0:
                    verdict, why = "ERROR", tool_error or f"exit {rc}"
                else:
                    run = CheckConfig().run
                    facts = ModelFacts.of(ModelFile(model), run.slot_align, run.slot_windows)
                    if seed not in self.correct:
                        self.correct[seed] = probe([sys.executable, "-m", "engine"], model, facts, work / "correct")
                    diff = difference(self.correct[seed], probe(shlex.split(cmd), model, facts, work / "broken"))
                    verdict, why = ("MISSED", diff) if diff else \
                        ("cannot", f"no probe run differs{'; it needs ' + f.needs if f.needs else ''}")
        return rec | {"verdict": verdict, "why": why, "exit": rc, "failed": failed[:5],
                      "seconds": round(time.monotonic() - t0, 1), "load": round(os.getloadavg()[0], 2),
                      "commit": current_commit(), "date": time.strftime("%Y-%m-%d %H:%M")}


SYMBOL = {"caught": "C", "cannot": "·", "MISSED": "**M**", "ERROR": "**E**"}


def render(records: list[dict]) -> str:
    by_cell = {(r["fault"], r["seed"]): r for r in records}
    shapes = sorted({r["seed"] for r in records})
    faults = [f for f in FAULT_SET if any(r["fault"] == f for r in records)]
    verdicts = Counter(r["verdict"] for r in records)
    exposable = verdicts["caught"] + verdicts["MISSED"] + verdicts["ERROR"]
    out = ["# Faults x shapes", "",
           "`python bench/fault_shapes.py`: each fault of the project's fault set (tests/faults.py) injected into a "
           "copy of the bundled engine and checked with `epmci check --fast` on generated models "
           "(epmci/synth/shapes.py), none a preset, none with a golden baseline. A cell the check passes is run "
           "beside the correct engine through the bench's probe (every switch, -t 1-3, -b 1 and 3, every kernel "
           "path, a tight arena, a long decode): no difference = the shape cannot expose the fault (·), a "
           "difference = MISSED (**M**). C = caught (exit 1), **E** = the check blamed itself (exit 2).", "",
           f"{len(faults)} faults x {len(shapes)} shapes = {len(records)} cells: caught {verdicts['caught']} of "
           f"{exposable} that could expose their fault, missed {verdicts['MISSED']}, errors {verdicts['ERROR']}, "
           f"cannot be exposed {verdicts['cannot']}.", "",
           recorded_at(records, "cells") + " (a later commit's cells were run after a fix; see git log).", "",
           "| fault | kind | " + " | ".join(str(s) for s in shapes) + " |",
           "|---|---|" + "---|" * len(shapes)]
    for f in faults:
        cells = [SYMBOL[by_cell[(f, s)]["verdict"]] if (f, s) in by_cell else " " for s in shapes]
        out.append(f"| {f} | {FAULT_SET[f].kind} | " + " | ".join(cells) + " |")
    left = [f for f in FAULT_SET if f not in faults]
    if left:
        out += ["", "Not run yet: " + "; ".join(left) + "."]
    out += ["", "## Shapes", ""] + [f"- {s}: {shape_text(next(r['shape'] for r in records if r['seed'] == s))}"
                                   for s in shapes]
    out += ["", "## Cells not caught", ""]
    for r in sorted(records, key=lambda r: (list(FAULT_SET).index(r["fault"]), r["seed"])):
        if r["verdict"] != "caught":
            out.append(f"- {r['fault']} on shape {r['seed']}: {r['verdict']}: {r['why']}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = sweep_arguments(__doc__, "0-19", "docs/perf-data/fault-shapes.jsonl", "docs/fault-shapes.md")
    ap.add_argument("--faults", default="", help="';'-separated names of tests/faults.py FAULT_SET (default: all)")
    a = ap.parse_args(argv)
    names = [n for n in a.faults.split(";") if n] or list(FAULT_SET)
    unknown = [n for n in names if n not in FAULT_SET]
    if unknown:
        print(f"--faults: no fault named {unknown[0]!r} in tests/faults.py", file=sys.stderr)
        return 2
    out = Path(a.out)
    records = recorded(out, a.resume, a.render)
    if records is None:
        return 2
    if not a.render:
        done, cells, t0 = {(r["seed"], r["fault"]) for r in records}, Cells(), time.monotonic()
        for seed in seeds(a.seeds):
            for fault in names:
                if (seed, fault) in done:
                    continue
                if time.monotonic() - t0 > 60 * a.max_minutes:
                    print(f"stopping at --max-minutes {a.max_minutes}; --resume continues", file=sys.stderr)
                    atomic_write(a.table, render(records))
                    return 3
                r = cells.run(seed, fault)
                records.append(r)
                append(out, r)
                print(f"shape {seed}, {fault}: {r['verdict']} in {r['seconds']:.0f} s"
                      + (f" ({r['why']})" if r["why"] else ""), flush=True)
    atomic_write(a.table, render(records))
    bad = [r for r in records if r["verdict"] in ("MISSED", "ERROR")]
    print(f"{len(records)} cells, {len(bad)} missed or errors; table in {a.table}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
