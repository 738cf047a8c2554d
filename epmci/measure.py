"""One measured engine run: the KPIs of its stats JSONL and a correctness fingerprint.

Shared by `epmci bench`, the perf suite of `epmci check`, `epmci golden update` and
`--perf-base`, so all of them measure the same way: the model's page cache dropped first
(posix_fadvise DONTNEED), greedy, raw prompt, stats and logits written by the engine
(docs/engine-contract.md).

The fingerprint of a run: the generated token ids (greedy, so the argmax of the logits
rows from the last prompt row on), the sha256 of the logits file's float32 bytes and of the
generated text. Counters are the exact stats fields per phase; timing fields (tok/s, RSS)
are measurements.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .contract_io import STATS_TIMING_FIELDS, ContractError, read_logits, read_stats
from .engine_runner import EngineCommand, EngineRun, drop_page_cache, run_engine
from .machine import CpuContention

PHASES = ("prefill", "decode")
# Direction of a counter change: fewer reads and misses, more hits are better. Any counter
# not listed (tokens, slots, arena size, ...) is neutral: a change is just a change.
LOWER_IS_BETTER = frozenset({"misses", "evictions", "ssd_bytes", "ssd_bytes_per_token", "prefetch_issued"})
HIGHER_IS_BETTER = frozenset({"hits", "prefetch_used", "hit_rate", "prefetch_used_rate"})


@dataclass
class RunSpec:
    """What one engine run is asked to do (always greedy, seed 0, --no-chat)."""
    prompt: str
    n_predict: int = 16
    batch: int = 8
    ctx: int = 256
    threads: int = 1
    arena_mb: float | None = None        # None: the engine's default arena
    ram_budget_mb: float | None = None
    prefetch: bool = True
    env: dict = field(default_factory=dict)
    profile_out: str | None = None       # --profile-out PATH

    def args(self, model: str | os.PathLike, out: Path) -> list[str]:
        a = ["-m", str(model), "-p", self.prompt, "-n", str(self.n_predict), "-c", str(self.ctx),
             "-t", str(self.threads), "-b", str(self.batch), "--temp", "0", "--seed", "0",
             "--no-chat", "--no-interactive", "--stats-file", str(out / "stats.jsonl"),
             "--dump-logits", "--logits-out", str(out / "logits.bin")]
        if self.arena_mb is not None:
            a += ["--arena-mb", f"{self.arena_mb:.6f}"]
        if self.ram_budget_mb is not None:
            a += ["--ram-budget-mb", f"{self.ram_budget_mb:g}"]
        if not self.prefetch:
            a.append("--no-prefetch")
        if self.profile_out:
            a += ["--profile-out", str(self.profile_out)]
        return a

    def settings(self) -> dict:
        """The settings a baseline depends on (recorded in golden files)."""
        return {"n_predict": self.n_predict, "batch": self.batch, "ctx": self.ctx, "threads": self.threads,
                "arena_mb": None if self.arena_mb is None else round(self.arena_mb, 6),
                "ram_budget_mb": self.ram_budget_mb, "prefetch": self.prefetch,
                "env": dict(sorted(self.env.items()))}


@dataclass
class Measurement:
    label: str
    ok: bool
    failure: str | None = None
    run: EngineRun | None = None
    stats: dict = field(default_factory=dict)        # phase -> the stats record
    counters: dict = field(default_factory=dict)     # phase -> {field: exact value}
    tok_s: float = 0.0                               # decode tok/s
    prefill_tok_s: float = 0.0
    peak_rss_mb: float = 0.0
    vm_swap_mb: float = 0.0
    prompt_tokens: int = 0
    first_tokens: list[int] = field(default_factory=list)
    logits_sha256: str = ""
    logits_rows: int = 0
    text_sha256: str = ""
    gen_rows: np.ndarray | None = None               # logits rows from the last prompt row on (kept)
    other_cpu_pct: float | None = None               # CPU others took during the run (machine.CpuContention)

    @property
    def seconds(self) -> float:
        return self.run.seconds if self.run else 0.0

    def fingerprint(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "first_tokens": list(self.first_tokens),
                "logits_rows": self.logits_rows, "logits_sha256": self.logits_sha256,
                "text_sha256": self.text_sha256}

    def decode(self, name: str, default=0):
        return self.stats.get("decode", {}).get(name, default)


def numba_threads_env(threads: int) -> dict[str, str]:
    """numba refuses more threads than NUMBA_NUM_THREADS (default: the CPU count)."""
    if "NUMBA_NUM_THREADS" in os.environ:
        return {}
    return {"NUMBA_NUM_THREADS": str(max(threads, os.cpu_count() or 1))}


def measure(engine: EngineCommand, model: str | os.PathLike, spec: RunSpec, outdir: str | os.PathLike,
            *, timeout: float, keep_rows: int = 0, drop_cache: bool = True,
            cwd: str | os.PathLike | None = None, label: str = "", keep_files: bool = False,
            env: dict | None = None) -> Measurement:
    """Run the engine once and read what it wrote. Never raises for engine failures: a run
    that failed or wrote unusable output is a Measurement with ok=False and the reason."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("stats.jsonl", "logits.bin"):      # the stats file is appended to
        (out / name).unlink(missing_ok=True)
    if drop_cache:
        drop_page_cache(model)
    e = numba_threads_env(spec.threads)
    e.update(env or {})
    e.update({str(k): str(v) for k, v in spec.env.items()})
    with CpuContention() as busy:
        run = run_engine(engine, spec.args(model, out), timeout=timeout, label=label, env=e, cwd=cwd or out)
    m = Measurement(label, False, run=run, other_cpu_pct=busy.other_pct)
    if not run.ok:
        m.failure = run.failure()
        return m
    if run.slot_errors:
        m.failure = f"engine reported a slot error: {run.slot_errors[0]}"
        return m
    try:
        recs = read_stats(out / "stats.jsonl")
        logits_bytes = (out / "logits.bin").read_bytes() if (out / "logits.bin").exists() else b""
        logits = read_logits(out / "logits.bin")
    except ContractError as err:
        m.failure = f"output unusable: {err}"
        return m
    m.stats = {r["phase"]: r for r in recs}
    m.counters = {r["phase"]: {k: v for k, v in r.items() if k != "phase" and k not in STATS_TIMING_FIELDS}
                  for r in recs}
    m.tok_s = float(m.stats.get("decode", {}).get("tok_s", 0.0))
    m.prefill_tok_s = float(m.stats.get("prefill", {}).get("tok_s", 0.0))
    m.peak_rss_mb = max(float(r.get("peak_rss_mb", 0.0)) for r in recs)
    m.vm_swap_mb = max(float(r.get("vm_swap_mb", 0.0)) for r in recs)
    p = int(m.stats.get("prefill", {}).get("tokens", 0))
    if p <= 0 or logits.shape[0] < p:
        m.failure = f"output unusable: {logits.shape[0]} logits rows for a {p}-token prompt"
        return m
    gen = logits[p - 1:]
    m.prompt_tokens = p
    m.first_tokens = [int(t) for t in np.argmax(gen, axis=1)]
    m.logits_sha256 = hashlib.sha256(logits_bytes[4:]).hexdigest()
    m.logits_rows = int(logits.shape[0])
    m.text_sha256 = hashlib.sha256(run.stdout).hexdigest()
    if keep_rows:
        m.gen_rows = np.array(gen[:keep_rows], dtype=np.float32)
    m.ok = True
    if not keep_files:
        for name in ("logits.bin",):
            (out / name).unlink(missing_ok=True)
    return m


def remove_dir(path: str | os.PathLike) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------ comparisons

@dataclass
class CounterChange:
    key: str              # phase.field
    golden: object
    current: object
    kind: str             # worse | better | changed

    def text(self) -> str:
        g, c = self.golden, self.current
        rel = ""
        if isinstance(g, (int, float)) and isinstance(c, (int, float)) and g:
            rel = f" ({(c - g) / abs(g) * 100:+.1f}%)"
        return f"{self.key} {g} -> {c}{rel}"


def counter_changes(golden: dict, current: dict) -> list[CounterChange]:
    """Every exact counter that differs between two {phase: {field: value}} maps, classified."""
    out = []
    for phase in sorted(set(golden) | set(current), key=lambda p: (PHASES + (p,)).index(p)):
        g, c = golden.get(phase, {}), current.get(phase, {})
        for k in list(g) + [k for k in c if k not in g]:
            gv, cv = g.get(k, "<missing>"), c.get(k, "<missing>")
            if gv == cv:
                continue
            kind = "changed"
            if isinstance(gv, (int, float)) and isinstance(cv, (int, float)):
                if k in LOWER_IS_BETTER:
                    kind = "worse" if cv > gv else "better"
                elif k in HIGHER_IS_BETTER:
                    kind = "worse" if cv < gv else "better"
            out.append(CounterChange(f"{phase}.{k}", gv, cv, kind))
    return out


@dataclass
class Drift:
    rows: int             # rows compared
    kl_max: float         # max over rows of KL(golden || current), nats
    kl_mean: float
    top1_agree: int       # rows whose argmax agrees
    max_abs: float
    first_row_differ: int | None

    def text(self) -> str:
        if self.rows == 0:
            return "no logits rows to compare"
        where = "" if self.first_row_differ is None else f", first differing row {self.first_row_differ}"
        return (f"KL(golden||current) max {self.kl_max:.3g} mean {self.kl_mean:.3g} nats over {self.rows} rows, "
                f"top-1 agreement {self.top1_agree}/{self.rows}, max |diff| {self.max_abs:.3g}{where}")

    def props(self) -> dict:
        return {"kl_max": self.kl_max, "kl_mean": self.kl_mean, "top1_agree": self.top1_agree,
                "rows_compared": self.rows, "max_abs_diff": self.max_abs}


def drift(golden_rows: np.ndarray, current_rows: np.ndarray) -> Drift:
    """KL divergence and top-1 agreement of the rows both sides have (golden is P)."""
    from .check.compare import log_softmax64
    n = min(len(golden_rows), len(current_rows))
    if n == 0 or golden_rows.shape[1:] != current_rows.shape[1:]:
        return Drift(0, float("inf"), float("inf"), 0, float("inf"), 0)
    a, b = np.asarray(golden_rows[:n]), np.asarray(current_rows[:n])
    la, lb = log_softmax64(a), log_softmax64(b)
    kl = (np.exp(la) * (la - lb)).sum(axis=1)
    neq = np.nonzero((a.view(np.uint32) != b.view(np.uint32)).any(axis=1))[0]
    return Drift(n, float(kl.max()), float(kl.mean()), int((a.argmax(1) == b.argmax(1)).sum()),
                 float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()),
                 int(neq[0]) if len(neq) else None)


def miss_rate(c: dict) -> float:
    n = c.get("hits", 0) + c.get("misses", 0)
    return 100.0 * c.get("misses", 0) / n if n else 0.0


def io_diagnosis(before: dict, after: dict) -> tuple[bool, str]:
    """Did the decode phase's I/O move between two runs (bytes/token or miss rate)? The
    counters are exact, so any change is real. `before`/`after` are decode stats records."""
    if not before or not after:
        return False, "no decode counters to tell an I/O regression from compute"
    b0, b1 = before.get("ssd_bytes_per_token", 0), after.get("ssd_bytes_per_token", 0)
    m0, m1 = miss_rate(before), miss_rate(after)
    if b0 != b1 or before.get("misses") != after.get("misses") or before.get("hits") != after.get("hits"):
        rel = f"{(b1 - b0) / b0 * 100:+.1f}%" if b0 else f"{b0} -> {b1}"
        return True, (f"I/O moved too: SSD bytes/token {rel} ({b0 / 2**20:.3f} -> {b1 / 2**20:.3f} MiB), "
                      f"miss rate {m0:.1f}% -> {m1:.1f}%: an I/O regression")
    return False, (f"bytes/token ({b0 / 2**20:.3f} MiB) and miss rate ({m0:.1f}%) unchanged: "
                   f"not I/O -- compute, or noise")
