"""The one place an engine command line is built (docs/engine-contract.md, Command line).

A RunSpec is what one engine run is asked to do -- greedy, seed 0, raw prompt (--no-chat)
unless it says otherwise, stats and logits written into the run's output directory. The correctness
suites, the perf measurements, golden recording, --perf-base and `epmci bench` all build
their runs from it; the selftest has its own small builder below. The pager's flags
(--arena-mb, --ram-budget-mb, --no-prefetch, --profile-out, --no-pager) go only to an engine
that declares the pager (EngineCommand.has): one without it is never asked to page, nor to
stop paging.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..units import arena_flag
from .outputs import ContractError, read_stats
from .process import EngineCommand, EngineRun, StartedEngine, run_engine, start_engine
from .promises import Promises

STATS_FILE = "stats.jsonl"
LOGITS_FILE = "logits.bin"


@dataclass
class RunSpec:
    prompt: str
    n_predict: int = 16
    batch: int = 8
    ctx: int = 256
    threads: int = 1
    pager: bool = True                   # False: --no-pager (and none of the pager's flags)
    arena_mb: float | None = None        # None: the engine's default arena
    ram_budget_mb: float | None = None
    prefetch: bool = True
    env: dict = field(default_factory=dict)
    profile_out: str | None = None       # --profile-out PATH
    tokens_in: str | None = None         # --tokens-in FILE (teacher forcing) instead of -p/-n
    chat: bool = False                   # True: the engine's chat template (no --no-chat)
    temp: float = 0.0                    # --temp (0: greedy)
    seed: int = 0                        # --seed
    dump_logits: bool = True             # False: no logits file (benchmarks time decode only)
    kernels: str | None = None           # --kernels NAME: a kernel path the engine declares (None: its default)

    def args(self, model: str | os.PathLike, out: Path, pager_flags: bool = True,
             pace_fds: tuple[int, int] | None = None) -> list[str]:
        """`pace_fds` (read, write): the engine's ends of the pacing channel (--pace-fds)."""
        given = ["--tokens-in", self.tokens_in] if self.tokens_in else ["-p", self.prompt, "-n", str(self.n_predict)]
        a = ["-m", str(model), *given, "-c", str(self.ctx),
             "-t", str(self.threads), "-b", str(self.batch), "--temp", f"{self.temp:g}", "--seed", str(self.seed),
             *([] if self.chat else ["--no-chat"]), "--no-interactive", "--stats-file", str(out / STATS_FILE)]
        if self.dump_logits:
            a += ["--dump-logits", "--logits-out", str(out / LOGITS_FILE)]
        if pace_fds is not None:
            a += ["--pace-fds", f"{pace_fds[0]},{pace_fds[1]}"]
        if self.kernels:
            a += ["--kernels", self.kernels]
        if not pager_flags:
            return a
        if not self.pager:
            return a + ["--no-pager"]
        if self.arena_mb is not None:
            a += ["--arena-mb", arena_flag(self.arena_mb)]
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


def run(engine: EngineCommand, model: str | os.PathLike, spec: RunSpec, out: Path, *, timeout: float,
        label: str = "", env: dict | None = None, cwd: str | os.PathLike | None = None,
        promises: Promises | None = None) -> EngineRun:
    """Run `spec` with its outputs in `out`; `env` is added under the spec's own. With
    `promises`, a paged run that exits 0 is held to the contract's resource promises (a
    broken one makes it fail; unreadable stats are left to the caller to report)."""
    full_env = _env(spec, env)
    r = run_engine(engine, spec.args(model, out, engine.has("pager")), timeout=timeout, label=label,
                   env=full_env, cwd=cwd, out_dir=out)
    if promises is not None and r.ok and engine.has("pager") and spec.pager:
        try:
            records = read_stats(out / STATS_FILE, engine.stats_fields())
        except ContractError:
            return r
        r.broken_promises = promises.broken(arena_mb=spec.arena_mb, batch=spec.batch,
                                            ram_budget_mb=spec.ram_budget_mb, env=full_env, records=records)
    return r


def start(engine: EngineCommand, model: str | os.PathLike, spec: RunSpec, out: Path, *, pace_fds: tuple[int, int],
          timeout: float, label: str = "", env: dict | None = None, cwd: str | os.PathLike | None = None,
          cpus: frozenset[int] | None = None) -> StartedEngine:
    """Start `spec` paced over `pace_fds` (inherited by the engine), without waiting."""
    return start_engine(engine, spec.args(model, out, engine.has("pager"), pace_fds), out, timeout=timeout, label=label,
                        env=_env(spec, env), cwd=cwd, pass_fds=pace_fds, cpus=cpus)


def _env(spec: RunSpec, env: dict | None) -> dict:
    return {**(env or {}), **{str(k): str(v) for k, v in spec.env.items()}}


def selftest_args(model: str | os.PathLike, tests: list[tuple[int, int, int, Path]], *,
                  threads: int, ctx: int, batch: int, arena_mb: float, kernels: str | None = None) -> list[str]:
    """--selftest L:E:N:OUT for each (layer, expert, rows, out) of tests (more than one only
    to an engine with feature selftest_batch) through the paged path, with the run's pager
    settings (and a declared kernel path: `--kernels P`)."""
    return ["-m", str(model), "-t", str(threads), "-c", str(ctx), "-b", str(batch), "--arena-mb", arena_flag(arena_mb),
            *(a for il, e, rows, out in tests for a in ("--selftest", f"{il}:{e}:{rows}:{out}")),
            *(["--kernels", kernels] if kernels else [])]
