#!/usr/bin/env python3
"""Headline benchmark: the paged engine vs llama.cpp (mmap) inside a memory cap.

Both run the same GGUF (default: the bench preset, ~3 GB; --preset or --model for another)
in a cgroup-v1 memory limit of one third of the file -- the limit counts the page cache
too, so llama.cpp's mmap cannot keep the model resident and the engine must live within
its arena. The model's pages are dropped from the page cache before every run. Decode
tok/s, median of --repeat runs, interleaved (engine, engine --no-prefetch, llama.cpp,
engine, ...) so all see the same machine conditions. Needs root and /sys/fs/cgroup/memory.
llama.cpp is skipped when llama_cpp is absent. The runs are also written as JSON (--out) so
the table can be re-rendered or compared.

Usage: python bench/headline.py [--model PATH | --preset bench] [--repeat 3] [--n-predict 16]
                                [--threads 2] [--cap-fraction 0.333 | --cap-mb 8192]
                                [--arena-fraction 0.55 | --engine-arena] [--out results/headline.json]
                                [--resident-too] [--buffered-too] [--ref GIT_REF] [--no-llama] [--belady]

--cap-mb sets the cap itself (the production case: `--preset prod35-full --cap-mb 8192
--engine-arena`, the engine choosing its arena from --ram-budget-mb = the cap). Each run's
row reports the share of decode spent waiting for reads, and the table ends with the
disk's own limit for the engine's reads: expert-sized O_DIRECT reads of the model, from as
many threads as the engine's readers, after the page cache is dropped -- MB/s and the
decode tok/s it allows at the engine's MiB per token.

--belady adds one untimed run of each paged engine row with its MoE dump (SDQ_MOE_DUMP): the
decode hit rate Belady's MIN gets on that run's own lookups with its slots -- the ceiling of
any eviction policy without prefetch -- beside the run's own hit rate.

--resident-too, --buffered-too and --ref add rows to the same interleaved run: the engine
(`--no-pager`) and llama.cpp with the whole file in memory (no limit; the file read into the
page cache before each run, inside the rows' own cgroup, so their peak counts it); the engine
with exact buffered reads; and the engine of another commit (an A/B of an engine change
measured on the same machine state, the only comparison this shared box supports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from epmci.contract.bundled import ARGV as BUNDLED_ARGV  # noqa: E402
from epmci.contract.outputs import ContractError, prompt_tokens, read_stats  # noqa: E402
from epmci.contract.process import drop_page_cache  # noqa: E402
from epmci.contract.runspec import STATS_FILE, RunSpec  # noqa: E402
from epmci.perf.speed import disk_mib_s  # noqa: E402

ENGINE_CTX = 512        # the engine's default context: the prompt and -n fit
# the prompt of every paging and decode bench (bench/paging.py, profile.py, decode.py)
PROMPT = "Write a short paragraph about how mixture-of-experts models route tokens."

LLAMA_SCRIPT = textwrap.dedent("""
    import json, sys, time
    import llama_cpp
    import numpy as np
    model, prompt, n, threads, repack = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    if not repack:   # every weight through the mmap: no repacked copies in anonymous memory
        defaults = llama_cpp.llama_cpp.llama_model_default_params
        def no_repack():
            p = defaults()
            p.use_extra_bufts = False
            return p
        llama_cpp.llama_cpp.llama_model_default_params = no_repack
    # n_threads_batch: llama-cpp-python's default prefills on every CPU whatever n_threads says
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_threads=threads, n_threads_batch=threads, use_mmap=True,
                          flash_attn=False, verbose=False)
    toks = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    t0 = time.perf_counter(); llm.eval(toks); t1 = time.perf_counter()
    for _ in range(n):
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        llm.eval([int(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).argmax())])
    t2 = time.perf_counter()
    print(json.dumps({"prompt_tokens": len(toks), "prefill_s": t1 - t0, "decode_tok_s": n / (t2 - t1)}))
""")


class MemoryCap:
    """A cgroup-v1 memory cgroup with a hard limit (None: no limit, only the peak is measured);
    children join it before exec."""

    def __init__(self, limit_bytes: int | None, name: str = "capped"):
        self.path = CGROUP_ROOT / f"epmci-headline-{os.getpid()}-{name}"
        self.path.mkdir()
        if limit_bytes is not None:
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        self.limit = limit_bytes

    def join(self) -> None:  # runs in the child between fork and exec
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def stats(self) -> dict:
        return {"max_usage_mb": int((self.path / "memory.max_usage_in_bytes").read_text()) / 2**20,
                "failcnt": int((self.path / "memory.failcnt").read_text())}

    def reset(self) -> None:
        """Per-run figures: peak usage and the count of hits on the limit (reclaim) start at 0."""
        (self.path / "memory.max_usage_in_bytes").write_text("0")
        (self.path / "memory.failcnt").write_text("0")

    def close(self) -> None:
        self.path.rmdir()


def run_capped(cap: MemoryCap, cmd: list[str], timeout: float, env: dict[str, str] | None = None,
               cwd: str | None = None) -> subprocess.CompletedProcess:
    cap.reset()
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=cap.join,
                              env={**os.environ, **(env or {})}, cwd=cwd or REPO)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, -999, e.stdout or "", f"timeout after {timeout}s")


@dataclass
class Row:
    """One engine row of the table: extra engine arguments, environment and checkout, and
    whether it runs resident (no limit, file in the page cache) or paged in the cap."""
    extra: list[str]
    env: dict[str, str]
    cwd: str | None = None
    resident: bool = False


def warm_page_cache(cgroup: MemoryCap, model: str) -> None:
    """Read the whole file into the page cache from a child in `cgroup` (its pages are then
    charged there, so the resident rows' peak counts the file they run from)."""
    drop_page_cache(model)
    subprocess.run(["cat", model], stdout=subprocess.DEVNULL, check=True, preexec_fn=cgroup.join)


def belady_hit_rate(model: str, dump_prefix: Path, stats: list[dict]) -> float:
    """The decode hit rate Belady's MIN gets on a paged run's own lookups (its MoE dump) with
    its slots: what no eviction policy can beat without prefetch."""
    from paging import belady_decode_hit_rate   # bench/paging.py (imports the engine)

    from epmci.check.routing import dumped_lookups
    from epmci.gguf.facts import ModelFacts
    from epmci.gguf.file import ModelFile
    facts = ModelFacts.of(ModelFile(model), 4096)   # the engine's slots: 4 KiB-aligned windows
    lookups, _ = dumped_lookups(facts, dump_prefix, prompt_tokens(stats))
    phases = [lk.phase for lk in lookups]
    return belady_decode_hit_rate({
        "trace": [(lk.layer, lk.experts) for lk in lookups], "class_of_layer": facts.class_of_layers(False),
        "n_slots": [int(stats[0].get("n_slots_small", 0)), int(stats[0].get("n_slots_large", 0))],
        "decode_start": phases.index("decode") if "decode" in phases else len(phases)})


def engine_run(cap, model, a, row: Row, arena_mb: int | None, belady: bool = False) -> dict:
    """One run of a row; with `belady` (paged rows) its MoE dump too, for Belady's MIN."""
    with tempfile.TemporaryDirectory() as td:
        spec = RunSpec(PROMPT, n_predict=a.n_predict, threads=a.threads, batch=8, ctx=ENGINE_CTX, dump_logits=False,
                       pager=not row.resident, arena_mb=None if row.resident else arena_mb,
                       ram_budget_mb=None if row.resident else cap.limit // 2**20)
        env = {**row.env, **({"SDQ_MOE_DUMP": str(Path(td) / "moe")} if belady else {})}
        r = run_capped(cap, [*BUNDLED_ARGV, *spec.args(model, Path(td)), *row.extra], a.timeout, env, row.cwd)
        if r.returncode != 0:
            return {"error": f"exit {r.returncode}: {r.stderr.strip()[-300:]}", **cap.stats()}
        stats = read_stats(Path(td) / STATS_FILE)
        if belady:   # a dump that cannot be read loses this figure, not the timed rounds
            try:
                return {"belady_hit_rate": belady_hit_rate(model, Path(td) / "moe", stats),
                        "hit_rate": {s["phase"]: s for s in stats}["decode"]["hit_rate"]}
            except ContractError as e:
                return {"error": f"its MoE dump: {e}"}
        dec = {s["phase"]: s for s in stats}["decode"]
        if row.resident:  # no pager: the paging counters are all 0 and say nothing
            return {"tok_s": dec["tok_s"], "peak_rss_mb": dec["peak_rss_mb"], **cap.stats()}
        return {"tok_s": dec["tok_s"], "hit_rate": dec["hit_rate"],
                "mb_per_token": dec["ssd_bytes_per_token"] / 2**20, "peak_rss_mb": dec["peak_rss_mb"],
                "prefetch_issued": dec["prefetch_issued"], "prefetch_used": dec["prefetch_used"],
                "io_wait_s": dec["io_wait_s"], "io_wait_pct": 100 * dec["io_wait_s"] / max(dec["seconds"], 1e-9),
                "arena_mb": dec["arena_mb"], "io_direct_pct": dec.get("io_direct_pct"), **cap.stats()}


def write_json(path: str, data: dict) -> None:
    """The runs as JSON, written to a temp file and renamed (no half-written results)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out)


def die(msg: str) -> None:
    """Bad input or a setup that cannot work: one line, exit 2."""
    print(f"headline.py: {msg}", file=sys.stderr)
    sys.exit(2)


def ref_worktree(ref: str) -> str:
    """A detached worktree of `ref` whose engine has compiled its kernels (numba cache).
    A ref git does not know, or whose engine cannot run, ends the bench with one line."""
    path = tempfile.mkdtemp(prefix="epmci-headline-ref-")
    add = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", path, ref],
                         capture_output=True, text=True)
    if add.returncode != 0:
        os.rmdir(path)
        die(f"--ref {ref}: {(add.stderr.strip().splitlines() or ['git worktree add failed'])[-1]}")
    from epmci.synth.store import make_model
    with tempfile.TemporaryDirectory() as td:
        spec = RunSpec(PROMPT, n_predict=2, ctx=ENGINE_CTX, dump_logits=False)
        warm = subprocess.run([*BUNDLED_ARGV, *spec.args(str(make_model("ci")), Path(td))], cwd=path,
                              env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True)
    if warm.returncode != 0:
        remove_worktree(path)
        die(f"--ref {ref}: its engine failed (exit {warm.returncode}): "
            f"{(warm.stderr.strip().splitlines() or [''])[-1]}")
    return path


def remove_worktree(path: str) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", path], check=False,
                   capture_output=True)


def llama_run(cap, model, a, repack: bool = True) -> dict:
    r = run_capped(cap, [sys.executable, "-c", LLAMA_SCRIPT, model, PROMPT, str(a.n_predict), str(a.threads),
                         "1" if repack else "0"], a.timeout)
    if r.returncode != 0:
        why = "OOM-killed" if r.returncode in (-9, 137) else f"exit {r.returncode}"
        return {"error": f"{why}: {r.stderr.strip()[-200:]}", **cap.stats()}
    return {"tok_s": json.loads(r.stdout.strip().splitlines()[-1])["decode_tok_s"], **cap.stats()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="GGUF file (default: the --preset's model)")
    ap.add_argument("--preset", default="bench", help="preset whose cached model to run (made if missing)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cap-fraction", type=float, default=1 / 3)
    ap.add_argument("--cap-mb", type=int, help="the cap in MiB (instead of --cap-fraction of the file)")
    ap.add_argument("--arena-fraction", type=float, default=0.55, help="of the cap, for the engine's arena")
    ap.add_argument("--engine-arena", action="store_true",
                    help="no --arena-mb: the engine sizes its arena from --ram-budget-mb (the cap)")
    ap.add_argument("--io-threads", type=int, default=4, help="the engine's readers (SDQ_IO_THREADS) for the disk limit")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", help="write the runs and medians as JSON here")
    ap.add_argument("--resident-too", action="store_true",
                    help="also run the engine (--no-pager) and llama.cpp without a limit, the file in the page cache")
    ap.add_argument("--buffered-too", action="store_true",
                    help="also run both engine rows with SDQ_DIRECT_IO=0 (exact reads through the page cache)")
    ap.add_argument("--ref", help="also run both engine rows with the engine of this git ref (a temporary "
                                  "worktree; its numba cache is warmed up outside the cap first)")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp even when it is installed")
    ap.add_argument("--belady", action="store_true",
                    help="one more run of each paged engine row, with its MoE dump: the decode hit rate of "
                         "Belady's MIN on its own lookups and slots (not timed)")
    a = ap.parse_args()
    if not CGROUP_ROOT.is_dir() or os.geteuid() != 0:
        die("needs root and the cgroup-v1 memory controller at /sys/fs/cgroup/memory")
    if a.model is None:
        from epmci.synth.store import make_model
        a.model = str(make_model(a.preset))
    if not os.path.isfile(a.model):
        die(f"{a.model}: no such file")
    size = os.path.getsize(a.model)
    worktree = ref_worktree(a.ref) if a.ref else None   # before the cgroup: a bad ref leaves nothing
    cap = MemoryCap(a.cap_mb * 2**20 if a.cap_mb else int(size * a.cap_fraction))
    unlimited = MemoryCap(None, "resident") if a.resident_too else None
    arena_mb = None if a.engine_arena else int(cap.limit * a.arena_fraction / 2**20)
    try:
        import llama_cpp  # noqa: F401
        llama_missing = "skipped (--no-llama)" if a.no_llama else ""
    except ImportError:
        llama_missing = "not installed"
    have_llama = not llama_missing
    # prefetch off too: layer-ahead predictions that miss read bytes nobody uses, which
    # matters most when the disk is the bottleneck
    engines = {"engine": Row([], {}), "engine --no-prefetch": Row(["--no-prefetch"], {})}
    if a.buffered_too:
        engines.update({f"{name}, SDQ_DIRECT_IO=0": Row(row.extra, {"SDQ_DIRECT_IO": "0"})
                        for name, row in list(engines.items())})
    if unlimited:
        engines["engine --no-pager, resident"] = Row([], {}, resident=True)
    if worktree:
        engines.update({f"{name} @{a.ref}": Row(row.extra, {**row.env, "PYTHONPATH": worktree}, worktree,
                                                row.resident)
                        for name, row in list(engines.items())})
    # name: (resident, repacked weights); llama.cpp repacks Q4_K for its AVX2 kernels into
    # anonymous memory by default, which a cap cannot reclaim
    llamas = {"llama.cpp": (False, True), "llama.cpp, no repack": (False, False),
              **({"llama.cpp, resident": (True, True)} if unlimited else {})}
    runs: dict[str, list[dict]] = {name: [] for name in (*engines, *llamas)}
    disks: list[dict] = []

    def cgroup_for(resident: bool) -> MemoryCap:
        """The run's cgroup, with the page cache as the run expects it: the file read in
        (resident) or dropped (capped)."""
        if resident:
            warm_page_cache(unlimited, a.model)
            return unlimited
        drop_page_cache(a.model)
        return cap

    try:
        for i in range(a.repeat):
            for name, row in engines.items():
                runs[name].append(engine_run(cgroup_for(row.resident), a.model, a, row, arena_mb))
                print(f"[{i + 1}/{a.repeat}] {name} {runs[name][-1]}", file=sys.stderr)
            for name, (resident, repack) in (llamas.items() if have_llama else ()):
                runs[name].append(llama_run(cgroup_for(resident), a.model, a, repack))
                print(f"[{i + 1}/{a.repeat}] {name} {runs[name][-1]}", file=sys.stderr)
            disks.append(disk_mib_s(a.model, a.io_threads, n_reads=256, seed=i))   # the disk varies too: in every round
            print(f"[{i + 1}/{a.repeat}] disk {disks[-1]['mb_per_s']:.0f} MiB/s", file=sys.stderr)
        # the routing and the counters are the same in every run: one dumped run per paged row
        belady = {name: engine_run(cgroup_for(False), a.model, a, row, arena_mb, belady=True)
                  for name, row in engines.items() if a.belady and not row.resident}
    finally:
        drop_page_cache(a.model)   # the resident cgroup holds the file's pages until they go
        cap.close()
        if unlimited:
            unlimited.close()
        if worktree:
            remove_worktree(worktree)
    disk = {**disks[0], "mb_per_s": statistics.median(d["mb_per_s"] for d in disks),
            "mb_per_s_runs": [round(d["mb_per_s"], 1) for d in disks]}
    arenas = sorted({round(r["arena_mb"]) for rs in runs.values() for r in rs if "arena_mb" in r})
    print(f"model {a.model}: {size / 2**30:.2f} GiB; cap {cap.limit / 2**30:.2f} GiB "
          f"({cap.limit / size:.2f} of the file); engine arena {arena_mb if arena_mb else arenas} MiB"
          f"{' (its own, from --ram-budget-mb)' if arena_mb is None else ''}; -t {a.threads}; "
          f"{a.n_predict} decoded tokens; median of {a.repeat}")
    print(f"disk: {disk['mb_per_s']:.0f} MiB/s (median of {len(disks)}) for {disk['expert_bytes'] / 2**20:.2f} MiB experts' aligned "
          f"windows, {disk['threads']} threads, {'O_DIRECT' if disk['o_direct'] else 'buffered'}")
    print("| engine | decode tok/s | runs ok | hit rate | MiB/token | io_wait | disk-limit tok/s "
          "| prefetch used/issued | O_DIRECT | peak cgroup MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = {}
    for name, rs in runs.items():
        ok = [r for r in rs if "tok_s" in r]
        if not rs:   # only llama.cpp's rows run nothing
            print(f"| {name} | {llama_missing} | | | | | | | | |")
            continue
        if not ok:
            print(f"| {name} | failed: {rs[0]['error'][:60]} | 0/{len(rs)} | | | | | | | "
                  f"{max(r['max_usage_mb'] for r in rs):.0f} |")
            continue
        med[name] = statistics.median(r["tok_s"] for r in ok)
        hit = statistics.median(r["hit_rate"] for r in ok) if "hit_rate" in ok[0] else None
        mbt = statistics.median(r["mb_per_token"] for r in ok) if "mb_per_token" in ok[0] else None
        pf = (f"{statistics.median(r['prefetch_used'] for r in ok):.0f}/"
              f"{statistics.median(r['prefetch_issued'] for r in ok):.0f}") if "prefetch_used" in ok[0] else ""
        direct = f"{ok[0]['io_direct_pct']:.0f} %" if ok[0].get("io_direct_pct") is not None else ""
        wait = f"{statistics.median(r['io_wait_pct'] for r in ok):.0f} %" if "io_wait_pct" in ok[0] else ""
        limit = f"{disk['mb_per_s'] / mbt:.2f}" if mbt else ""
        print(f"| {name} | {med[name]:.2f} | {len(ok)}/{len(rs)} | {'' if hit is None else f'{hit:.1f} %'} "
              f"| {'' if mbt is None else f'{mbt:.1f}'} | {wait} | {limit} | {pf} | {direct} "
              f"| {max(r['max_usage_mb'] for r in ok):.0f} |")
    for name, b in belady.items():
        print(f"Belady's MIN on {name}'s lookups and slots: decode hit rate "
              + (f"{b['belady_hit_rate']:.1f} % (the run: {b['hit_rate']:.1f} %)" if "belady_hit_rate" in b
                 else f"not known, the dumped run failed: {b['error'][:80]}"))
    print()
    for llama in (name for name in llamas if name in med):
        for name in (name for name in engines if name in med):
            print(f"ratio {name} / {llama}: {med[name] / med[llama]:.2f}x")
    if a.out:
        write_json(a.out, {"model": a.model, "file_bytes": size, "cap_bytes": cap.limit, "arena_mb": arena_mb,
                           "threads": a.threads, "n_predict": a.n_predict, "runs": runs, "median_tok_s": med,
                           "belady": belady,
                           "disk": disk})
    return 0


if __name__ == "__main__":
    sys.exit(main())
