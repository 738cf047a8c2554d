#!/usr/bin/env python3
"""Paging bench on the ci model (or --preset ci-skew): decode tok/s, hit rate and MiB/token per setting.

    python bench/paging.py [--preset ci] [--repeat 5] [--n-predict 32] [--threads 1] [--json OUT]

Settings: 2-3 arena sizes x {baseline (prefetch on, parallel I/O, aligned O_DIRECT
windows), prefetch off, parallel I/O off}, plus uniform slots, same-layer prefetch and
exact buffered reads (SDQ_DIRECT_IO=0) at the smallest arena. Every run is a fresh
in-process Engine with SDQ_FADV_DONTNEED=1, after the model file was dropped from the page
cache, so expert reads really go to the disk. The settings run round-robin (one run of
each, `--repeat` times, after one warm-up run) so a load spike on the shared machine hits
them all alike; timing figures are medians; the counters are exact, so identical in every
run.

Beside the LRU hit rate: the hit rate of Belady's offline optimal policy (MIN) on the same
decode lookup trace with the same slots per class, i.e. the best any eviction policy
could do without prefetch. The trace is the routing, identical for every setting (paged
and resident logits are byte-identical), so MIN depends on the arena only. The
prefetch-off rows are pure LRU; with prefetch the hit rate also counts experts that
prefetch brought in.

Each run's generated tokens are checked against a resident (--no-pager) run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.paging.arena import MiB  # noqa: E402
from engine.paging.cache_policy import simulate_belady  # noqa: E402
from engine.paging.config import PagerConfig  # noqa: E402
from engine.runtime import Engine, Options  # noqa: E402
from epmci.contract.outputs import STATS_MEASURED_FIELDS  # noqa: E402
from epmci.contract.process import drop_page_cache  # noqa: E402
from epmci.synth.store import make_model  # noqa: E402
from headline import PROMPT  # noqa: E402  (the bench prompt, one place: bench/headline.py)

BATCH = 8


def one_run(model: str, arena_mb: float | None, env: dict, threads: int, n_predict: int,
            pager: bool = True) -> dict:
    drop_page_cache(model)
    cfg = PagerConfig.from_env(arena_mb=arena_mb, env={"SDQ_FADV_DONTNEED": "1", **env}) if pager else None
    eng = Engine(model, Options(n_ctx=256, threads=threads, batch=BATCH, pager=pager, pager_config=cfg))
    try:
        p = eng.experts if pager else None
        if p is not None:
            p.trace = []
        mark = []
        toks = eng.encode_prompt(PROMPT, chat=False)
        gen, _ = eng.generate(toks, n_predict,
                              on_token=lambda t: mark.append(len(p.trace)) if p is not None and not mark else None)
        recs = {r["phase"]: r for r in eng.stats_records()}
        out = {"tokens": gen, "decode": recs.get("decode", {})}
        if p is not None:
            out.update(trace=p.trace, decode_start=mark[0], n_slots=p.plan.n_slots,
                       class_of_layer=p.plan.class_of_layer, slot_names=p.plan.class_names)
        return out
    finally:
        eng.close()


def belady_decode_hit_rate(run: dict) -> float:
    """The decode hit rate of Belady's MIN on a run's lookups (`trace`: (layer, experts) in
    run order, decode from `decode_start`) with its slots (`n_slots` per class of
    `class_of_layer`)."""
    flags = simulate_belady(run["trace"], run["class_of_layer"], run["n_slots"])
    dec = [f for g in flags[run["decode_start"]:] for f in g]
    return 100.0 * sum(dec) / len(dec) if dec else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="ci", help="ci, or ci-skew (skewed expert popularity)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--arenas", default="0.15,0.20,0.25", help="fractions of the expert bytes")
    ap.add_argument("--json", help="also write the results as JSON")
    a = ap.parse_args()

    model = str(make_model(a.preset))
    probe = Engine(model, Options(n_ctx=256, batch=BATCH, pager_config=PagerConfig.from_env(env={})))
    expert_mib = probe.experts.expert_bytes_total / MiB
    min_mib = probe.experts.plan.min_bytes / MiB
    probe.close()

    print(f"[bench] model {model}: {expert_mib:.1f} MiB of experts, minimum arena {min_mib:.2f} MiB "
          f"at -b {BATCH}; {a.repeat} runs per setting, {a.n_predict} tokens, -t {a.threads}",
          file=sys.stderr)
    ref = one_run(model, None, {}, a.threads, a.n_predict, pager=False)   # also the JIT warm-up
    fracs = [float(f) for f in a.arenas.split(",")]
    settings = []
    for i, f in enumerate(fracs):
        mb = round(expert_mib * f, 2)
        settings.append(("baseline", f, mb, {}))
        settings.append(("prefetch=off", f, mb, {"SDQ_PREFETCH": "0"}))
        settings.append(("io-parallel=off", f, mb, {"SDQ_IO_PARALLEL": "0"}))
        if i == 0:
            settings.append(("uniform slots", f, mb, {"SDQ_FORCE_UNIFORM_SLOT": "1"}))
            settings.append(("same-layer prefetch", f, mb, {"SDQ_PREFETCH_LAYER_AHEAD": "0"}))
            settings.append(("exact reads, buffered", f, mb, {"SDQ_DIRECT_IO": "0"}))

    all_runs: list[list[dict]] = [[] for _ in settings]
    for r in range(a.repeat):
        for runs, (name, f, mb, env) in zip(all_runs, settings):
            runs.append(one_run(model, mb, env, a.threads, a.n_predict))
        print(f"[bench] round {r + 1}/{a.repeat} done", file=sys.stderr)
    rows = []
    for runs, (name, f, mb, env) in zip(all_runs, settings):
        dec = [r["decode"] for r in runs]
        exact = {json.dumps({k: v for k, v in r.items() if k not in STATS_MEASURED_FIELDS}, sort_keys=True)
                 for r in dec}
        d0 = dec[0]
        row = {
            "setting": name, "arena_frac": f, "arena_mb": d0["arena_mb"],
            "slots": f"{d0['n_slots_small']}/{d0['n_slots_large']}",
            "tok_s": statistics.median(r["tok_s"] for r in dec),
            "tok_s_all": [r["tok_s"] for r in dec],
            "hit_rate": d0["hit_rate"],
            "belady_hit_rate": belady_decode_hit_rate(runs[0]),
            "mib_per_token": d0["ssd_bytes_per_token"] / MiB,
            "io_mib_per_token": d0["io_bytes"] / d0["tokens"] / MiB,
            "io_direct_pct": d0["io_direct_pct"],
            "prefetch_used_rate": d0["prefetch_used_rate"],
            "evictions_per_token": d0["evictions"] / d0["tokens"],
            "io_wait_s": statistics.median(r["io_wait_s"] for r in dec),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in dec),
            "counters_identical": len(exact) == 1,
            "tokens_match_resident": all(r["tokens"] == ref["tokens"] for r in runs),
        }
        rows.append(row)
        print(f"[bench] {name} @ {mb} MiB: {row['tok_s']:.2f} tok/s, hit {row['hit_rate']:.1f}% "
              f"(MIN {row['belady_hit_rate']:.1f}%), {row['mib_per_token']:.2f} MiB/token", file=sys.stderr)

    lines = [
        f"{a.preset} model, -b {BATCH}, -t {a.threads}, {a.n_predict} generated tokens, SDQ_FADV_DONTNEED=1, "
        f"median of {a.repeat}; resident (--no-pager) decode: {ref['decode']['tok_s']:.2f} tok/s",
        "",
        "| setting | arena MiB (% of experts) | slots small/large | decode tok/s | hit rate LRU | "
        "hit rate Belady MIN | MiB/token (read) | O_DIRECT | prefetch used | evictions/token | io_wait s | "
        "exact & correct |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for r in rows:
        ok = "yes" if r["counters_identical"] and r["tokens_match_resident"] else "NO"
        lines.append(
            f"| {r['setting']} | {r['arena_mb']:.2f} ({100 * r['arena_frac']:.0f}%) | {r['slots']} | "
            f"{r['tok_s']:.2f} | {r['hit_rate']:.1f}% | {r['belady_hit_rate']:.1f}% | "
            f"{r['mib_per_token']:.2f} ({r['io_mib_per_token']:.2f}) | {r['io_direct_pct']:.0f}% | "
            f"{r['prefetch_used_rate']:.1f}% | {r['evictions_per_token']:.1f} | "
            f"{r['io_wait_s']:.3f} | {ok} |")
    print("\n".join(lines))
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "resident_tok_s": ref["decode"]["tok_s"],
                                            "date": time.strftime("%Y-%m-%d")}, indent=1))
    return 0 if all(r["counters_identical"] and r["tokens_match_resident"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
