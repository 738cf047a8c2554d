#!/usr/bin/env python3
"""The engine beside llama.cpp in one interleaved run: resident decode and prefill at -t 1
and -t 2, and the paged engine in a memory cap of 1/3 of the file.

    python bench/decode.py [--model PATH | --preset bench] [--repeat 3] [--n-predict 32]
                           [--prompt-tokens 128] [--batch N] [--no-paged] [--no-llama] [--out results/decode.json]

Every setting is a fresh process; one round runs each setting once, `--repeat` rounds
(after a warm-up round that is not counted), so a load change on the shared machine falls
on all settings alike. Figures are medians; ratios are of medians measured in the same run,
and beside each the median and range of its per-round ratios.

* engine -t N: `python -m engine --no-pager` (experts read from the mapped file, page cache
  warm), prefill and decode tok/s from its stats file; `-b` is --batch (default: the whole
  prompt in one micro-batch, as llama.cpp's n_batch of 512 takes it).
* llama.cpp -t N: llama-cpp-python (mmap, same file, same prompt, greedy), when installed;
  n_threads and n_threads_batch both N.
* paged engine -t 2, cap 1/3: the engine with its pager inside a cgroup-v1 memory limit of
  a third of the file (the limit counts the page cache; the model's pages are dropped
  before each run), arena 55 % of the cap, --ram-budget-mb the cap (bench/headline.py's
  setup). Needs root and /sys/fs/cgroup/memory; otherwise the row says why it is missing.
  Beside it, every round, the disk probe (epmci.perf.speed.disk_mib_s: the engine's expert
  windows, O_DIRECT) gives the disk's limit for the bytes the paged decode reads per token.
* --kernels portable,auto runs each engine row once per kernel path (before/after a kernel
  change, in the same rounds).
* --ref GIT_REF adds the resident rows run by the engine of that git ref (a temporary
  worktree, its default kernels): before/after a change, ratios from the same rounds.

The prompt is bench/headline.py's words, repeated and cut to exactly `--prompt-tokens`
tokens of the model's tokenizer (prefill needs more than a handful of tokens to measure),
without the chat template; both engines report the count they prefilled.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headline import (CGROUP_ROOT, ENGINE_CTX, LLAMA_SCRIPT, PROMPT, REPO, MemoryCap, drop_page_cache,  # noqa: E402
                      ref_worktree, remove_worktree, run_capped, write_json)

from epmci.contract.bundled import ARGV as BUNDLED_ARGV  # noqa: E402
from epmci.contract.outputs import read_stats  # noqa: E402
from epmci.contract.runspec import STATS_FILE, RunSpec  # noqa: E402
from epmci.perf.speed import disk_mib_s  # noqa: E402

MiB = 1 << 20


def die(msg: str) -> None:
    print(f"decode.py: {msg}", file=sys.stderr)
    sys.exit(2)


def warm_page_cache(path: str) -> None:
    """Read the whole file once, so a resident run after the paged one (which drops the
    model's pages) starts with the page cache warm, as every resident row is measured."""
    buf = bytearray(16 * MiB)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def engine_run(model: str, prompt: str, threads: int, a, cap: MemoryCap | None = None,
               kernels: str = "auto", worktree: str | None = None) -> dict:
    """One engine run; `worktree`: the engine of that checkout (--ref), its default kernels."""
    with tempfile.TemporaryDirectory() as td:
        # resident: --batch (prefill is measured); paged: -b 8 (headline.py's)
        spec = RunSpec(prompt, n_predict=a.n_predict, threads=threads, ctx=ENGINE_CTX, dump_logits=False,
                       pager=cap is not None, batch=a.batch if cap is None else 8)
        if cap is None:
            cmd = [*BUNDLED_ARGV, *spec.args(model, Path(td))] + (["--kernels", kernels] if worktree is None else [])
            env = {**os.environ, "PYTHONPATH": worktree} if worktree else None
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, cwd=worktree or REPO,
                                   env=env)
            except subprocess.TimeoutExpired:
                return {"error": f"timeout after {a.timeout}s"}
        else:
            spec.arena_mb, spec.ram_budget_mb = int(cap.limit * 0.55 / MiB), cap.limit // MiB
            drop_page_cache(model)
            r = run_capped(cap, [*BUNDLED_ARGV, *spec.args(model, Path(td)), "--kernels", kernels], a.timeout)
            warm_page_cache(model)
        if r.returncode != 0:
            return {"error": f"exit {r.returncode}: {r.stderr.strip()[-300:]}"}
        recs = {s["phase"]: s for s in read_stats(Path(td) / STATS_FILE)}
        dec = recs["decode"]
        paged = {} if cap is None else {
            "decode_read_mib_per_token": dec["ssd_bytes_per_token"] / MiB,
            "decode_io_wait_share": dec["io_wait_s"] / dec["seconds"] if dec["seconds"] > 0 else None}
        return {**paged, "prefill_tok_s": recs["prefill"]["tok_s"], "decode_tok_s": dec["tok_s"],
                "prompt_tokens": recs["prefill"]["tokens"], "decode_tokens": recs["decode"]["tokens"]}


def disk_probe(model: str) -> dict:
    """The disk's read speed for the paged row's reads; the probe drops the model's pages, so
    they are read back after it: a resident row after it would otherwise read the experts
    from disk (the first engine row of a round prefilled at half speed that way)."""
    r = {"disk_mib_s": disk_mib_s(model)["mb_per_s"]}
    warm_page_cache(model)
    return r


def llama_run(model: str, prompt: str, threads: int, a) -> dict:
    try:
        # "1": llama.cpp's default repacked weights, its fastest resident setup
        r = subprocess.run([sys.executable, "-c", LLAMA_SCRIPT, model, prompt, str(a.n_predict), str(threads), "1"],
                           capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {a.timeout}s"}
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}: {r.stderr.strip()[-300:]}"}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"prefill_tok_s": out["prompt_tokens"] / out["prefill_s"], "decode_tok_s": out["decode_tok_s"],
            "prompt_tokens": out["prompt_tokens"]}


def prompt_of(model: str, n_tokens: int) -> str:
    """PROMPT's words, cycled, to exactly n_tokens tokens of the model's tokenizer: words
    while they fit, then single characters of the next word (a word can take several)."""
    from engine.gguf_model import GGUFModel
    tok = GGUFModel(model).tokenizer
    count = lambda text: len(tok.encode(text, parse_special=True)) if text else 0
    words, text, i = PROMPT.split(), "", 0
    while count(text) < n_tokens:
        word = (" " if text else "") + words[i % len(words)]
        i += 1
        if count(text + word) <= n_tokens:
            text += word
            continue
        before = text
        for ch in word:
            if count(text + ch) > n_tokens:
                break
            text += ch
        if text == before:
            break
    if count(text) != n_tokens:
        die(f"{model}: cannot make a prompt of exactly {n_tokens} tokens from the bench prompt's words")
    return text


def median(runs: list[dict], key: str) -> float | None:
    ok = [r[key] for r in runs if key in r]
    return statistics.median(ok) if ok else None


def round_ratios_of(num: list[dict], den: list[dict], key: str) -> list[float]:
    """num / den round by round: the two ran minutes apart at most there, so a drift of the
    shared machine's speed between rounds cancels. Every round holds one record per setting
    (a failed run one with "error"), so the lists pair by index; a round where either failed
    gives no ratio."""
    return [rn[key] / rd[key] for rn, rd in zip(num, den, strict=True) if rn.get(key) and rd.get(key)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=128, help="the prompt's length in tokens")
    ap.add_argument("--batch", type=int, help="the resident engine's -b (default: --prompt-tokens, one micro-batch)")
    ap.add_argument("--threads", default="1,2", help="resident thread counts")
    ap.add_argument("--kernels", default="auto",
                    help="engine kernel paths to run side by side, e.g. portable,auto (before/after a kernel)")
    ap.add_argument("--ref", help="also run the resident rows with the engine of this git ref (before/after)")
    ap.add_argument("--no-paged", action="store_true", help="skip the capped paged row")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", help="write every run and the medians as JSON here")
    a = ap.parse_args()
    if a.repeat < 1 or a.n_predict < 2 or a.prompt_tokens < 1 or (a.batch is not None and a.batch < 1):
        die("--repeat, --prompt-tokens, --batch must be >= 1 and --n-predict >= 2")
    a.batch = a.batch or a.prompt_tokens
    try:
        threads = [int(t) for t in a.threads.split(",")]
    except ValueError:
        die(f"--threads {a.threads!r}: expected a comma-separated list of integers")
    if a.model is None:
        from epmci.synth.store import make_model
        a.model = str(make_model(a.preset))
    if not os.path.isfile(a.model):
        die(f"{a.model}: no such file")
    prompt = prompt_of(a.model, a.prompt_tokens)
    have_llama = False
    if not a.no_llama:
        try:
            import llama_cpp  # noqa: F401
            have_llama = True
        except ImportError:
            pass
    paths = a.kernels.split(",")
    engine_name = lambda t, k: f"engine -t {t}" + (f" ({k})" if len(paths) > 1 else "")
    ref_name = lambda t: f"engine -t {t} @{a.ref}"
    worktree = ref_worktree(a.ref) if a.ref else None
    settings: dict[str, object] = {}
    for t in threads:
        for k in paths:
            settings[engine_name(t, k)] = lambda t=t, k=k: engine_run(a.model, prompt, t, a, kernels=k)
        if worktree:
            settings[ref_name(t)] = lambda t=t: engine_run(a.model, prompt, t, a, worktree=worktree)
        if have_llama:
            settings[f"llama.cpp -t {t}"] = lambda t=t: llama_run(a.model, prompt, t, a)
    paged_note = None
    cap = None
    if a.no_paged:
        paged_note = "skipped (--no-paged)"
    elif not CGROUP_ROOT.is_dir() or os.geteuid() != 0:
        paged_note = "skipped: needs root and the cgroup-v1 memory controller"
    else:
        cap = MemoryCap(int(os.path.getsize(a.model) / 3))
        settings["paged engine -t 2, cap 1/3"] = lambda: engine_run(a.model, prompt, 2, a, cap, kernels=paths[-1])
        # the disk's limit for the paged row: its reads (expert windows, O_DIRECT, the engine's
        # 4 reader threads), probed in every round beside it
        settings["disk probe"] = lambda: disk_probe(a.model)
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    warm_page_cache(a.model)
    try:
        for rnd in range(a.repeat + 1):
            for name, run in settings.items():
                r = {**run(), "load_avg_1min": os.getloadavg()[0]}   # how busy the shared machine was
                if rnd > 0:
                    runs[name].append(r)
                print(f"[{'warm-up' if rnd == 0 else f'{rnd}/{a.repeat}'}] {name}: {r}", file=sys.stderr)
    finally:
        if cap is not None:
            cap.close()
        if worktree:
            remove_worktree(worktree)
    med = {name: {k: median(rs, k) for k in ("prefill_tok_s", "decode_tok_s", "decode_read_mib_per_token",
                                              "decode_io_wait_share", "disk_mib_s")}
           for name, rs in runs.items()}
    ntok = next((r["prompt_tokens"] for rs in runs.values() for r in rs if "prompt_tokens" in r), None)
    loads = [r["load_avg_1min"] for rs in runs.values() for r in rs]
    print(f"model {a.model}; prompt {ntok} tokens (engine -b {a.batch}), {a.n_predict} generated; median of {a.repeat} "
          f"interleaved rounds; load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
    print("| setting | prefill tok/s | decode tok/s | runs ok |")
    print("|---|---:|---:|---:|")
    for name, rs in runs.items():
        if name == "disk probe":
            continue
        ok = sum("decode_tok_s" in r for r in rs)
        m = med[name]
        if not ok:
            print(f"| {name} | failed: {rs[0].get('error', '')[:80]} | | 0/{len(rs)} |")
            continue
        print(f"| {name} | {m['prefill_tok_s']:.2f} | {m['decode_tok_s']:.2f} | {ok}/{len(rs)} |")
    if paged_note:
        print(f"| paged engine -t 2, cap 1/3 | {paged_note} | | |")
    print()
    ratios, round_ratios = {}, {}

    def ratio(label: str, num: str, den: str, key: str) -> None:
        """num / den of the medians, and per round (round_ratios_of)."""
        m, d = med.get(num), med.get(den)
        if m and d and m[key] and d[key]:
            ratios[label] = m[key] / d[key]
            round_ratios[label] = round_ratios_of(runs[num], runs[den], key)

    for key, phase in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
        for t in threads:
            for k in paths:
                ratio(f"{phase} -t {t}: {engine_name(t, k)} / llama.cpp", engine_name(t, k), f"llama.cpp -t {t}", key)
                if k != paths[0]:
                    ratio(f"{phase} -t {t}: {k} / {paths[0]}", engine_name(t, k), engine_name(t, paths[0]), key)
                if worktree:
                    ratio(f"{phase} -t {t}: {engine_name(t, k)} / @{a.ref}", engine_name(t, k), ref_name(t), key)
        for k in paths:   # thread scaling
            if len(threads) > 1:
                ratio(f"{phase} {engine_name(threads[-1], k)} / -t {threads[0]}", engine_name(threads[-1], k),
                      engine_name(threads[0], k), key)
        if have_llama and len(threads) > 1:
            ratio(f"{phase} llama.cpp -t {threads[-1]} / -t {threads[0]}", f"llama.cpp -t {threads[-1]}",
                  f"llama.cpp -t {threads[0]}", key)
    p, e2 = med.get("paged engine -t 2, cap 1/3"), med.get(engine_name(2, paths[-1]))
    if p and e2 and p["decode_tok_s"] and e2["decode_tok_s"]:
        ratios["decode -t 2: paged (cap 1/3) / resident"] = p["decode_tok_s"] / e2["decode_tok_s"]
    disk = med.get("disk probe")
    if p and p["decode_read_mib_per_token"] and disk and disk["disk_mib_s"]:
        limit = disk["disk_mib_s"] / p["decode_read_mib_per_token"]
        print(f"paged decode reads {p['decode_read_mib_per_token']:.1f} MiB/token, waits for reads "
              f"{100 * p['decode_io_wait_share']:.0f} % of the time; the disk reads {disk['disk_mib_s']:.0f} MiB/s "
              f"(expert windows, O_DIRECT): at most {limit:.2f} tok/s")
        ratios["decode -t 2: paged (cap 1/3) / the disk's limit for its reads"] = p["decode_tok_s"] / limit
    for k, v in ratios.items():
        per = round_ratios.get(k)
        print(f"{k}: {v:.3f}x" + (f" (per round: median {statistics.median(per):.3f}x, {min(per):.3f}-{max(per):.3f})"
                                  if per else ""))
    if a.out:
        write_json(a.out, {"model": a.model, "prompt_tokens": ntok, "engine_batch": a.batch, "n_predict": a.n_predict,
                           "repeat": a.repeat,
                           "runs": runs, "medians": med, "ratios": ratios, "round_ratios": round_ratios})
    return 0


if __name__ == "__main__":
    sys.exit(main())
