"""The wall time of `epmci check` split into N shards, the shards run one after another on
this machine: each shard's time, their sum and the longest one (what a fleet of N such
runners would wait for), and whether the merged verdict, cases and counts equal the
unsharded run's. The speed-up a fleet gives is then a measured figure, not a claim.

    python bench/shards.py record --model ci --shards 1,2,3 --out docs/perf-data/shards/ci.jsonl
    python bench/shards.py record --model prod35-full --shards 2,3 --cap-mb 8192 \\
        --out docs/perf-data/shards/prod35-full.jsonl --resume -- --profile epm-8gb
    python bench/shards.py table docs/perf-data/shards/ci.jsonl

Each run is `epmci check --fast` (plus the arguments after `--`), one line appended to the
JSONL as it ends, so a session can stop between runs and `--resume` goes on from there
(`--max-minutes` starts no run after that many minutes: no job here may run 30). The
unsharded run comes first; its report balances the shards (`--durations`), as a workflow
would use an earlier report. With --cap-mb every run (epmci and its engines) is inside a
cgroup-v1 memory limit counting the page cache, the page cache dropped first (root). With
--cold-reference every run starts without the reference's memoized forwards (what a fresh
runner has): otherwise the runs after the first find the forwards it computed, and a shard
holding the model suite takes a fraction of what it takes on a runner of its own.
Reports go to --work (default ~/.cache/epmci/bench-shards/<model>).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from epmci.check.reference_runs import memo_dir  # noqa: E402
from epmci.perf.machine import CpuContention  # noqa: E402
from headline import MemoryCap  # noqa: E402
from pairs import die, read_recording  # noqa: E402


def cases(report: dict) -> list[list[str]]:
    return [[s["name"], r["name"], r["status"]] for s in report["suites"] for r in s["results"]]


class Stop(Exception):
    """--max-minutes reached before the named run."""


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=False)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_one(name: str, argv: list[str], work: Path, cap: MemoryCap | None, timeout: float,
            cold_reference: bool) -> dict:
    """One `epmci check` (or merge) run, timed; its JSON report read back."""
    report = work / (name.replace(" shards: ", "-shards-").replace("/", "-of-") + ".json")
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "epmci", *argv, "--json", str(report)]
    if cold_reference:
        shutil.rmtree(memo_dir(), ignore_errors=True)
    if cap:
        drop_page_cache()
        cap.reset()
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    with CpuContention() as others:      # the quiet-machine evidence: CPU other processes took meanwhile
        try:
            rc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                                preexec_fn=cap.join if cap else None).returncode
        except subprocess.TimeoutExpired:
            rc = None
    rec = {"run": name, "argv": argv, "rc": rc, "seconds": round(time.perf_counter() - t0, 1),
           "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
           "other_cpu_pct": others.other_pct, "reference_cache": "cold" if cold_reference else "as found"}
    if cap:
        rec.update(cap.stats())
    if report.exists():
        rep = json.loads(report.read_text())
        rec.update(verdict=rep["verdict"], counts=rep["counts"], cases=cases(rep), report=str(report),
                   shard=rep["meta"].get("shard", {}).get("index"),
                   expected_seconds=rep["meta"].get("shard", {}).get("expected_seconds"))
    return rec


def record(a) -> int:
    out, work = Path(a.out), Path(a.work or Path.home() / ".cache/epmci/bench-shards" / a.model)
    work.mkdir(parents=True, exist_ok=True)
    if not a.max_minutes > 0:
        die(f"--max-minutes must be > 0, got {a.max_minutes}")
    done = {r["run"]: r for r in read_recording(out)} if a.resume else {}
    if out.exists() and not a.resume:
        die(f"{out} exists: --resume to go on with it, or another --out")
    try:
        counts = [int(x) for x in a.shards.split(",")]
    except ValueError:
        die(f"--shards must be counts like 1,2,3, got {a.shards!r}")
    if any(n < 1 for n in counts):
        die(f"--shards must be counts >= 1, got {a.shards!r}")
    cap = MemoryCap(a.cap_mb << 20, "shards") if a.cap_mb else None
    base = ["check", "--fast", "-q", "--model", a.model, *a.check_args]
    out.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 60 * a.max_minutes

    def step(name: str, argv: list[str]) -> dict:
        if name in done:
            return done[name]
        if time.monotonic() > deadline:
            raise Stop(name)
        print(f"[shards] {name}: epmci {' '.join(argv)}  (load {os.getloadavg()[0]:.2f})", flush=True)
        cold = a.cold_reference and argv[0] == "check"         # a merge computes no forward
        rec = {**run_one(name, argv, work, cap, a.timeout, cold), "model": a.model, "cap_mb": a.cap_mb}
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        done[name] = rec
        print(f"[shards] {name}: {rec.get('verdict')} in {rec['seconds']} s", flush=True)
        return rec

    try:
        whole = step("whole", base)
        if "report" not in whole:
            die(f"the unsharded check wrote no report (exit {whole['rc']})")
        for n in counts:
            shards = [step(f"{n} shards: {k}/{n}", [*base, "--shard", f"{k}/{n}", "--durations", whole["report"]])
                      for k in range(1, n + 1)]
            if not all("report" in s for s in shards):
                print(f"[shards] {n} shards: a shard wrote no report; no merge", flush=True)
                continue
            step(f"{n} shards: merge", ["merge", *(s["report"] for s in shards)])
    except Stop as next_run:
        print(f"[shards] --max-minutes {a.max_minutes} reached before {next_run}: --resume continues", flush=True)
    finally:
        if cap:
            cap.close()
    return 0


def table(a) -> int:
    recs = {r["run"]: r for r in read_recording(Path(a.data))}
    whole = recs.get("whole")
    if not whole:
        die(f"{a.data}: no unsharded run")
    print(f"| shards | verdict | cases equal to unsharded | each shard (s) | longest (s) | sum (s) | "
          f"speed-up (unsharded / longest) | CPU of other processes, max % |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| unsharded | {whole.get('verdict')} ({_counts(whole)}) | -- | {whole['seconds']:.0f} | "
          f"{whole['seconds']:.0f} | {whole['seconds']:.0f} | 1.00x | {whole.get('other_cpu_pct')} |")
    for n in sorted({int(k.split()[0]) for k in recs if k != "whole"}):
        shards = [recs.get(f"{n} shards: {k}/{n}") for k in range(1, n + 1)]
        merged = recs.get(f"{n} shards: merge")
        if not merged or None in shards:
            print(f"| {n} | incomplete | | | | | | |")
            continue
        secs = [s["seconds"] for s in shards]
        same = merged.get("cases") == whole.get("cases") and merged.get("counts") == whole.get("counts")
        others = max((s.get("other_cpu_pct") or 0.0) for s in shards)
        print(f"| {n} | {merged.get('verdict')} ({_counts(merged)}) | {'yes' if same else 'NO'} | "
              f"{', '.join(f'{x:.0f}' for x in secs)} | {max(secs):.0f} | {sum(secs):.0f} | "
              f"{whole['seconds'] / max(secs):.2f}x | {others} |")
    print(f"\nThe reference's memoized forwards before each check: {whole.get('reference_cache', 'as found')}.")
    return 0


def _counts(r: dict) -> str:
    c = r.get("counts") or {}
    return f"{c.get('pass', 0)} passed, {c.get('fail', 0) + c.get('error', 0)} failed, {c.get('skip', 0)} skipped"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run the unsharded check, then each shard count's shards and merge")
    r.add_argument("--model", default="ci")
    r.add_argument("--shards", default="1,2,3", help="shard counts, comma-separated")
    r.add_argument("--out", required=True, help="JSONL the runs are appended to")
    r.add_argument("--work", help="where the reports go")
    r.add_argument("--resume", action="store_true", help="skip the runs already in --out")
    r.add_argument("--cold-reference", action="store_true",
                   help="remove the reference's memoized forwards before every check (a fresh runner)")
    r.add_argument("--max-minutes", type=float, default=float("inf"), help="start no run after this many minutes")
    r.add_argument("--cap-mb", type=int, help="a cgroup-v1 memory limit around every run (root)")
    r.add_argument("--timeout", type=float, default=1700.0, help="seconds a run may take (a session's job: < 30 min)")
    r.add_argument("check_args", nargs="*", help="after --: more arguments for every epmci check")
    r.set_defaults(func=record)
    t = sub.add_parser("table", help="the Markdown table of a recording")
    t.add_argument("data")
    t.set_defaults(func=table)
    a = ap.parse_args()
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
