"""`epmci bench`: the experiment matrix of the original harness, on this engine's knobs.

An experiment is data: a name, engine flag overrides (`args`) and environment overrides
(`env`) on top of fixed measurement conditions (FIXED). Suites are lists of experiment
names; `all` is every suite, duplicates (each suite's `baseline`) run once. The perf suite
of `epmci check` names its scenarios from the same catalog (perf.scenarios in epmci.yaml).

Every run: the model's page cache dropped first (posix_fadvise DONTNEED), the engine's RAM
budget enforced (--ram-budget-mb), greedy, every prompt, `--repeat` times. KPIs per
experiment: decode tok/s (median over repeats of decode tokens / decode seconds summed
over the prompts), hit rate, SSD MiB/token, peak RSS, VmSwap, slots, evictions, prefetch
used rate, plus a correctness fingerprint per prompt (generated token ids and sha256 of
the logits). An experiment whose outputs differ from the baseline row's, or between its
own repeats, is flagged. Results are data (JSON); to_markdown() renders the table with
deltas against the baseline row.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .engine_runner import EngineCommand
from .measure import Measurement, RunSpec, measure

MiB = 1 << 20
ROUTING_PROFILE = "{routing_profile}"   # env placeholder: a --profile-out file of a baseline run

FIXED = {
    "n_predict": 32,
    "ctx": 256,
    "batch": 8,
    "threads": 1,
    "arena_fraction": 0.25,     # of all expert bytes
    "ram_budget_mb": 1024.0,
}

PROMPTS = [
    "Write a short paragraph about how mixture-of-experts models route tokens.",
    "請用三句話說明什麼是 SSD、RAM、CPU 之間的資料分層。",
]


@dataclass(frozen=True)
class Experiment:
    name: str
    args: dict = field(default_factory=dict)   # threads, batch, arena_fraction, arena_mb, no_prefetch
    env: dict = field(default_factory=dict)    # SDQ_* overrides
    note: str = ""

    def spec(self, prompt: str, fixed: dict, expert_bytes: int, routing_profile: str | None = None,
             min_arena_mb: Callable[[int, bool], float] | None = None) -> RunSpec:
        """The run of this experiment on `prompt`: FIXED-like conditions overridden by args/env.
        An arena fraction is turned into MiB (rounded up in the 6th decimal), raised to
        min_arena_mb(batch, uniform) when given (the engine refuses an arena below it)."""
        a = {**fixed, **self.args}
        env = {k: (routing_profile or "") if v == ROUTING_PROFILE else str(v) for k, v in self.env.items()}
        batch = int(a["batch"])
        arena_mb = a.get("arena_mb")
        if arena_mb is None and a.get("arena_fraction") is not None:
            arena_mb = math.ceil(a["arena_fraction"] * expert_bytes / MiB * 1e6) / 1e6
            if min_arena_mb is not None:
                arena_mb = max(arena_mb, min_arena_mb(batch, env.get("SDQ_FORCE_UNIFORM_SLOT") == "1"))
        return RunSpec(prompt, n_predict=int(a["n_predict"]), batch=batch, ctx=int(a["ctx"]),
                       threads=int(a["threads"]), arena_mb=arena_mb, ram_budget_mb=a.get("ram_budget_mb"),
                       prefetch=not a.get("no_prefetch", False), env=env)

    @property
    def needs_routing_profile(self) -> bool:
        return ROUTING_PROFILE in self.env.values()


def _x(name: str, note: str = "", env: dict | None = None, **args) -> Experiment:
    return Experiment(name, dict(args), dict(env or {}), note)


_CATALOG = [
    _x("baseline", "FIXED conditions: 25% arena, -b 8, prefetch layer-ahead 1, 4 reader threads"),
    *[_x(f"threads={t}", "compute threads; outputs must not change", threads=t) for t in (2, 4)],
    _x("prefetch=off", "no prefetch: pure LRU", no_prefetch=True),
    _x("fadvise=on", "drop every expert range from the page cache after its read",
       env={"SDQ_FADV_DONTNEED": "1"}),
    *[_x(f"arena={p}%", "arena size sweep", arena_fraction=p / 100) for p in (15, 35, 50)],
    *[_x(f"batch={b}", "prefill micro-batch", batch=b) for b in (4, 16)],
    *[_x(f"io-threads={n}", "reader threads", env={"SDQ_IO_THREADS": str(n)}) for n in (1, 2, 8, 16)],
    _x("io-parallel=off", "an expert's gate, up, down read one after another", env={"SDQ_IO_PARALLEL": "0"}),
    _x("direct=off", "exact expert reads through the page cache, no aligned O_DIRECT windows",
       env={"SDQ_DIRECT_IO": "0"}),
    *[_x(f"hot-pin={n}", "pin the N hottest experts of a baseline routing profile",
         env={"SDQ_HOT_PIN": str(n), "SDQ_PROFILE_IN": ROUTING_PROFILE}) for n in (32, 64)],
    *[_x(f"admit={k}", "admit a missed expert on its k-th lookup", env={"SDQ_ADMIT_MIN_HITS": str(k)})
      for k in (2, 3)],
    _x("uniform-slots", "every slot sized for the largest expert", env={"SDQ_FORCE_UNIFORM_SLOT": "1"}),
    _x("layer-ahead=0", "predict the current layer's experts (overlap its attention only)",
       env={"SDQ_PREFETCH_LAYER_AHEAD": "0"}),
    _x("layer-ahead=2", "predict two layers ahead", env={"SDQ_PREFETCH_LAYER_AHEAD": "2"}),
    _x("pf(queue=256,stale=1)", "deeper prefetch queue, shorter staleness",
       env={"SDQ_PREFETCH_QUEUE": "256", "SDQ_PREFETCH_STALE_TOKENS": "1"}),
    _x("pf(queue=16)", "shallow prefetch queue", env={"SDQ_PREFETCH_QUEUE": "16"}),
]
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in _CATALOG}

SUITES: dict[str, list[str]] = {
    "quick": ["baseline", "threads=2", "prefetch=off", "fadvise=on", "arena=15%", "arena=35%",
              "batch=4", "batch=16", "hot-pin=64", "admit=2"],
    "io": ["baseline", "io-threads=1", "io-threads=2", "io-threads=8", "io-threads=16", "io-parallel=off",
           "direct=off", "fadvise=on"],
    "cache": ["baseline", "hot-pin=32", "hot-pin=64", "admit=2", "admit=3"],
    "slot": ["baseline", "uniform-slots"],
    "arena": ["baseline", "arena=15%", "arena=35%", "arena=50%"],
    "pf": ["baseline", "layer-ahead=0", "layer-ahead=2", "prefetch=off", "pf(queue=256,stale=1)", "pf(queue=16)"],
}


def select(suite: str, only: str | None = None) -> list[Experiment]:
    """The experiments of a suite (or `all`), deduplicated, filtered by --only substrings."""
    from .errors import InputError
    if suite != "all" and suite not in SUITES:
        raise InputError("--suite", f"unknown suite {suite!r} (choose from {', '.join([*SUITES, 'all'])})")
    names: list[str] = []
    for s in (list(SUITES) if suite == "all" else [suite]):
        names += [n for n in SUITES[s] if n not in names]
    if only:
        keys = [k.strip() for k in only.split(",") if k.strip()]
        names = [n for n in names if any(k in n for k in keys)]
        if not names:
            raise InputError("--only", f"no experiment of suite {suite} matches {only!r}")
    return [EXPERIMENTS[n] for n in names]


# ------------------------------------------------------------------ running

Progress = Callable[[str], None]


def _agg(runs: list[Measurement], key: str) -> int | float:
    return sum(r.decode(key, 0) for r in runs)


def summarize(exp: Experiment, runs: list[list[Measurement]], prompts: list[str]) -> dict:
    """runs[r][p]: repeat r, prompt p. KPIs of the decode phase over all prompts."""
    first = runs[0]
    per_repeat_tok_s = []
    for rep in runs:
        secs = sum(m.decode("seconds", 0.0) for m in rep)
        per_repeat_tok_s.append(round(_agg(rep, "tokens") / secs, 4) if secs > 0 else 0.0)
    hits, misses = _agg(first, "hits"), _agg(first, "misses")
    issued, used = _agg(first, "prefetch_issued"), _agg(first, "prefetch_used")
    tokens = _agg(first, "tokens")
    unstable = [i for i in range(len(prompts))
                if len({(rep[i].logits_sha256, json.dumps(rep[i].counters, sort_keys=True)) for rep in runs}) > 1]
    return {
        "name": exp.name, "args": exp.args, "env": exp.env, "note": exp.note,
        "tok_s": statistics.median(per_repeat_tok_s),
        "tok_s_all": per_repeat_tok_s,
        "prefill_tok_s": statistics.median(m.prefill_tok_s for rep in runs for m in rep),
        "hit_rate": round(100.0 * hits / (hits + misses), 2) if hits + misses else 0.0,
        "ssd_mib_per_token": round(_agg(first, "ssd_bytes") / tokens / MiB, 4) if tokens else 0.0,
        # what the reads moved, page padding of aligned windows included (engines that report it)
        "read_mib_per_token": (round(_agg(first, "io_bytes") / tokens / MiB, 4)
                               if tokens and all("io_bytes" in m.stats.get("decode", {}) for m in first) else None),
        "peak_rss_mb": max(m.peak_rss_mb for rep in runs for m in rep),
        "vm_swap_mb": max(m.vm_swap_mb for rep in runs for m in rep),
        "n_slots": first[0].decode("n_slots", 0),
        "slots_small_large": f"{first[0].decode('n_slots_small', 0)}/{first[0].decode('n_slots_large', 0)}",
        "evictions": _agg(first, "evictions"),
        "prefetch_used_rate": round(100.0 * used / issued, 2) if issued else 0.0,
        "decode_tokens": tokens,
        "fingerprints": [m.fingerprint() for m in first],
        "counters": [m.counters for m in first],
        "stable": not unstable,
        "unstable_prompts": unstable,
        "repeats": len(runs),
        # CPU other processes took during each run (%): a high figure explains a low tok/s
        "other_cpu_pct_max": max((m.other_cpu_pct for rep in runs for m in rep if m.other_cpu_pct is not None),
                                 default=None),
    }


def run_bench(experiments: list[Experiment], *, engine: EngineCommand, model: Path, expert_bytes: int,
              repeat: int, workdir: Path, fixed: dict | None = None, prompts: list[str] | None = None,
              timeout: float = 300.0, progress: Progress | None = None,
              min_arena_mb: Callable[[int, bool], float] | None = None) -> dict:
    fixed = {**FIXED, **(fixed or {})}
    prompts = list(prompts or PROMPTS)
    say = progress or (lambda s: None)
    results: list[dict] = []
    routing: str | None = None
    total = len(experiments) * repeat * len(prompts)
    done = 0
    base = next((e for e in experiments if e.name == "baseline"), experiments[0])
    base_fp: list[dict] | None = None
    t_start = time.time()
    for exp in sorted(experiments, key=lambda e: e is not base):     # the baseline row first
        if exp.needs_routing_profile and routing is None:
            routing = str(workdir / "routing.profile")
            spec = EXPERIMENTS["baseline"].spec(prompts[0], fixed, expert_bytes, None, min_arena_mb)
            spec.profile_out = routing
            m = measure(engine, model, spec, workdir / "routing", timeout=timeout, label="routing profile")
            say(f"[bench] routing profile for hot-pin from a baseline run: "
                f"{'ok' if m.ok else m.failure}")
            if not m.ok:
                routing = ""
        runs: list[list[Measurement]] = []
        error = None
        for r in range(repeat):
            rep = []
            for i, prompt in enumerate(prompts):
                done += 1
                spec = exp.spec(prompt, fixed, expert_bytes, routing, min_arena_mb)
                m = measure(engine, model, spec, workdir / "run", timeout=timeout, label=f"{exp.name} p{i} r{r}")
                if not m.ok:
                    error = m.failure
                    say(f"[bench {done:>{len(str(total))}}/{total}] {exp.name}  prompt {i + 1}/{len(prompts)} "
                        f"run {r + 1}/{repeat}: FAILED: {error}")
                    break
                same = ""
                if base_fp is not None:
                    same = ", outputs = baseline" if _same_output(m.fingerprint(), base_fp[i]) \
                        else ", OUTPUTS DIFFER FROM BASELINE"
                say(f"[bench {done:>{len(str(total))}}/{total}] {exp.name}  prompt {i + 1}/{len(prompts)} "
                    f"run {r + 1}/{repeat}: {m.tok_s:.2f} tok/s decode, hit {m.decode('hit_rate', 0):.1f}%, "
                    f"{m.decode('ssd_bytes_per_token', 0) / MiB:.3f} MiB/token, RSS {m.peak_rss_mb:.0f} MiB{same}")
                rep.append(m)
            if error:
                break
            runs.append(rep)
        if error:
            results.append({"name": exp.name, "args": exp.args, "env": exp.env, "note": exp.note, "error": error})
            done += (repeat - len(runs)) * len(prompts) - (len(rep) + 1)
            continue
        row = summarize(exp, runs, prompts)
        if exp is base:
            base_fp = row["fingerprints"]
        row["outputs_match_baseline"] = (None if base_fp is None or exp is base else
                                         all(_same_output(a, b) for a, b in zip(row["fingerprints"], base_fp)))
        results.append(row)
    return {"format": "epmci-bench/1", "fixed": fixed, "prompts": prompts, "repeat": repeat,
            "baseline": base.name, "seconds": round(time.time() - t_start, 1), "results": results}


def _same_output(a: dict, b: dict) -> bool:
    return a["first_tokens"] == b["first_tokens"] and a["logits_sha256"] == b["logits_sha256"]


# ------------------------------------------------------------------ report

def _delta(v, b, pct: bool = True) -> str:
    if not isinstance(v, (int, float)) or not isinstance(b, (int, float)) or v == b:
        return ""
    if pct and b:
        return f" ({(v - b) / abs(b) * 100:+.1f}%)"
    return f" ({v - b:+.3g})"


def to_markdown(bench: dict) -> str:
    rows = bench["results"]
    base = next((r for r in rows if r["name"] == bench["baseline"] and "error" not in r), None)
    head = ("| experiment | decode tok/s | hit rate | SSD MiB/token (read) | peak RSS MiB | VmSwap MiB "
            "| slots (small/large) | evictions | prefetch used | CPU taken by others | outputs |")
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | ❌ {r['error'].replace('|', '/')} | | | | | | | | | |")
            continue
        b = base if base is not None and r is not base else None
        g = (lambda k: b[k]) if b else (lambda k: None)
        if r["outputs_match_baseline"] is False:
            out = "⚠️ differ from baseline"
        elif not r["stable"]:
            out = "⚠️ differ between repeats"
        elif r["outputs_match_baseline"]:
            out = "✅ = baseline"
        else:
            out = "✅ (baseline)"
        read = "" if r.get("read_mib_per_token") is None else f" ({r['read_mib_per_token']:.3f})"
        busy = "" if r.get("other_cpu_pct_max") is None else f"up to {r['other_cpu_pct_max']:.0f}%"
        lines.append(
            f"| {r['name']} | {r['tok_s']:.2f}{_delta(r['tok_s'], g('tok_s'))} "
            f"| {r['hit_rate']:.1f}%{_delta(r['hit_rate'], g('hit_rate'), pct=False)} "
            f"| {r['ssd_mib_per_token']:.3f}{_delta(r['ssd_mib_per_token'], g('ssd_mib_per_token'))}{read} "
            f"| {r['peak_rss_mb']:.0f} | {r['vm_swap_mb']:.0f} | {r['n_slots']} ({r['slots_small_large']}) "
            f"| {r['evictions']}{_delta(r['evictions'], g('evictions'))} "
            f"| {r['prefetch_used_rate']:.1f}% "
            f"| {busy} | {out} |")
    f = bench["fixed"]
    notes = [f"Fixed: {f['n_predict']} tokens, -b {f['batch']}, -c {f['ctx']}, -t {f['threads']}, arena "
             f"{f['arena_fraction'] * 100:.0f}% of the expert bytes, --ram-budget-mb {f['ram_budget_mb']:g}; "
             f"{len(bench['prompts'])} prompts, median of {bench['repeat']} repeats, page cache dropped before "
             f"every run. Deltas against `{bench['baseline']}`; counters are exact, tok/s is not."]
    return "\n".join(lines + [""] + notes) + "\n"


def write_outputs(bench: dict, out_dir: Path, label: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    jf, mf = out_dir / f"bench_{label}.json", out_dir / f"bench_{label}.md"
    jf.write_text(json.dumps(bench, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    mf.write_text(to_markdown(bench), encoding="utf-8")
    return jf, mf


def main_bench(cfg, suite: str, only: str | None, repeat: int, out: str, label: str | None,
               n_predict: int | None, stream=None) -> int:
    """The `epmci bench` command (cfg: the CheckConfig for model and engine settings)."""
    import tempfile

    from .check.context import ModelFacts, mib
    from .check.runner import resolve_model
    from .errors import InputError
    from .gguf.file import ModelFile
    from .machine import fingerprint
    stream = stream or sys.stdout
    if repeat < 1:
        raise InputError("--repeat", f"must be >= 1, got {repeat}")
    exps = select(suite, only)
    model = resolve_model(cfg.model).resolve()
    facts = ModelFacts.of(ModelFile(model), cfg.run.slot_align, cfg.run.slot_windows)
    engine = EngineCommand.from_setting(cfg.engine.cmd, cfg.engine.env)
    fixed = dict(FIXED, threads=cfg.engine.threads)
    if n_predict is not None:
        fixed["n_predict"] = n_predict
    say = lambda s: print(s, file=stream, flush=True)  # noqa: E731
    say(f"[bench] model {model}, engine {engine.describe()}")
    say(f"[bench] {len(exps)} experiments x {len(PROMPTS)} prompts x {repeat} repeats; fixed {fixed}")
    with tempfile.TemporaryDirectory(prefix="epmci-bench-") as td:
        bench = run_bench(exps, engine=engine, model=model, expert_bytes=facts.total_expert_bytes(),
                          repeat=repeat, workdir=Path(td), fixed=fixed, timeout=cfg.engine.timeout_s,
                          progress=say, min_arena_mb=lambda b, u: mib(facts.min_arena_bytes(b, u)))
    bench.update(model=str(model), engine=engine.describe(), suite=suite, only=only,
                 machine=fingerprint(model.parent), started=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    jf, mf = write_outputs(bench, Path(out), label or suite)
    say("")
    say(to_markdown(bench))
    say(f"[bench] JSON -> {jf}")
    say(f"[bench] Markdown -> {mf}")
    flagged = [r["name"] for r in bench["results"] if "error" in r or r.get("outputs_match_baseline") is False
               or not r.get("stable", True)]
    if flagged:
        say(f"[bench] flagged (failed, or outputs differ): {', '.join(flagged)}")
        return 1
    return 0
