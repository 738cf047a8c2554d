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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..contract.outputs import ContractError, counters_of, read_logits, read_stats
from ..contract.process import EngineCommand, EngineRun, drop_page_cache
from ..contract.promises import Promises
from ..contract.runspec import LOGITS_FILE, STATS_FILE, RunSpec, run
from .machine import CpuContention


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

    def reproduces(self, other: "Measurement") -> bool:
        """The same exact counters and logits as `other` (a repeat of the same run must be)."""
        return self.counters == other.counters and self.logits_sha256 == other.logits_sha256


def unstable(runs: list[Measurement]) -> list[int]:
    """The 1-based numbers of the runs that do not reproduce the first: the one rule for
    "repeats of a run are reproducible" (golden recording, the perf suite, epmci bench)."""
    return [k for k, m in enumerate(runs[1:], 2) if not m.reproduces(runs[0])]


def prepare_outdir(outdir: str | os.PathLike) -> Path:
    """The run's output directory, without the files of an earlier run (stats are appended to)."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    for name in (STATS_FILE, LOGITS_FILE):
        (out / name).unlink(missing_ok=True)
    return out


def measure(engine: EngineCommand, model: str | os.PathLike, spec: RunSpec, outdir: str | os.PathLike,
            *, timeout: float, keep_rows: int = 0, drop_cache: bool = True,
            cwd: str | os.PathLike | None = None, label: str = "", keep_files: bool = False,
            env: dict | None = None, promises: Promises | None = None) -> Measurement:
    """Run the engine once and read what it wrote. Never raises for engine failures: a run
    that failed or wrote unusable output is a Measurement with ok=False and the reason."""
    out = prepare_outdir(outdir)
    if drop_cache:
        drop_page_cache(model)
    with CpuContention() as busy:
        # cwd: the caller's unless given, so a relative --engine-cmd path means what the user typed
        result = run(engine, model, spec, out, timeout=timeout, label=label, env=env, cwd=cwd, promises=promises)
    return read_measurement(engine, label, result, out, keep_rows=keep_rows, keep_files=keep_files,
                            other_cpu_pct=busy.other_pct)


def read_measurement(engine: EngineCommand, label: str, result: EngineRun, out: Path, *, keep_rows: int = 0,
                     keep_files: bool = False, other_cpu_pct: float | None = None) -> Measurement:
    """What a finished run of `engine` wrote into `out`, as a Measurement (ok=False with the
    reason when the run failed or its output is unusable)."""
    m = Measurement(label, False, run=result, other_cpu_pct=other_cpu_pct)
    if not result.ok:
        m.failure = result.failure()
        return m
    if result.slot_errors:
        m.failure = f"engine reported a slot error: {result.slot_errors[0]}"
        return m
    try:
        recs = read_stats(out / STATS_FILE, engine.stats_fields())
        logits_bytes = (out / LOGITS_FILE).read_bytes() if (out / LOGITS_FILE).exists() else b""
        logits = read_logits(out / LOGITS_FILE)
    except ContractError as err:
        m.failure = f"output unusable: {err}"
        return m
    m.stats = {r["phase"]: r for r in recs}
    m.counters = counters_of(recs)
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
    m.text_sha256 = hashlib.sha256(result.stdout).hexdigest()
    if keep_rows:
        m.gen_rows = np.array(gen[:keep_rows], dtype=np.float32)
    m.ok = True
    if not keep_files:
        (out / LOGITS_FILE).unlink(missing_ok=True)
    return m
