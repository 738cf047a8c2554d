"""`epmci bench`: a matrix of experiments (epmci.config.experiments), each run on every
prompt `--repeat` times.

Every run: the model's page cache dropped first (posix_fadvise DONTNEED), the engine's RAM
budget enforced (--ram-budget-mb), greedy. KPIs per experiment: decode tok/s (median over
repeats of decode tokens / decode seconds summed over the prompts), hit rate, SSD MiB/token,
peak RSS, VmSwap, slots, evictions, prefetch used rate, plus a correctness fingerprint per
prompt (generated token ids and sha256 of the logits). An experiment whose outputs differ
from the baseline row's, or between its own repeats, is flagged. Results are data (JSON);
to_markdown() renders the table with deltas against the baseline row.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

from ..config.experiments import EXPERIMENTS, FIXED, PROMPTS, Experiment, select
from ..config.schema import CheckConfig
from ..contract.process import EngineCommand
from ..errors import InputError
from ..fsutil import atomic_write
from ..gguf.facts import ModelFacts
from ..gguf.file import ModelFile
from ..synth.store import resolve_model
from .settings import for_model
from ..units import MiB
from .machine import fingerprint
from .measure import Measurement, measure, unstable

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
    not_reproduced = [i for i in range(len(prompts)) if unstable([rep[i] for rep in runs])]
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
        "stable": not not_reproduced,
        "unstable_prompts": not_reproduced,
        "repeats": len(runs),
        # CPU other processes took during each run (%): a high figure explains a low tok/s
        "other_cpu_pct_max": max((m.other_cpu_pct for rep in runs for m in rep if m.other_cpu_pct is not None),
                                 default=None),
    }


def run_bench(experiments: list[Experiment], *, engine: EngineCommand, model: Path, facts: ModelFacts,
              repeat: int, workdir: Path, fixed: dict | None = None, prompts: list[str] | None = None,
              timeout: float = 300.0, progress: Progress | None = None) -> dict:
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
            spec = EXPERIMENTS["baseline"].spec(prompts[0], fixed, facts)
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
                spec = exp.spec(prompt, fixed, facts, routing)
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


def bench_matrix(cfg: CheckConfig, suite: str, only: str | None, repeat: int, n_predict: int | None,
                 progress: Progress | None = None) -> dict:
    """`epmci bench` as a library call: the matrix `suite` (filtered by `only`) on the
    configured model and engine, every run in a temporary directory."""
    if repeat < 1:
        raise InputError("--repeat", f"must be >= 1, got {repeat}")
    say = progress or (lambda s: None)
    exps = select(suite, only)
    model = resolve_model(cfg.model).resolve()
    mf = ModelFile(model)
    cfg, _ = for_model(cfg, mf)
    facts = ModelFacts.of(mf, cfg.run.slot_align, cfg.run.slot_windows)
    engine = EngineCommand.of_settings(cfg.engine)
    fixed = dict(FIXED, threads=cfg.engine.threads)
    if n_predict is not None:
        fixed["n_predict"] = n_predict
    say(f"[bench] model {model}, engine {engine.describe()}")
    say(f"[bench] {len(exps)} experiments x {len(PROMPTS)} prompts x {repeat} repeats; fixed {fixed}")
    with tempfile.TemporaryDirectory(prefix="epmci-bench-") as td:
        bench = run_bench(exps, engine=engine, model=model, facts=facts, repeat=repeat, workdir=Path(td),
                          fixed=fixed, timeout=cfg.engine.timeout_s, progress=say)
    bench.update(model=str(model), engine=engine.describe(), suite=suite, only=only,
                 machine=fingerprint(model.parent), started=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return bench


def flagged(bench: dict) -> list[str]:
    """Experiments that failed, or whose outputs differ from the baseline or between repeats."""
    return [r["name"] for r in bench["results"] if "error" in r or r.get("outputs_match_baseline") is False
            or not r.get("stable", True)]


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
    jf, mf = out_dir / f"bench_{label}.json", out_dir / f"bench_{label}.md"
    atomic_write(jf, json.dumps(bench, indent=1, ensure_ascii=False, default=str) + "\n")
    atomic_write(mf, to_markdown(bench))
    return jf, mf
