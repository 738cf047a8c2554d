"""What every suite needs: the config, the model (as the reference sees it), the engine
command and what it declared it can do, a work directory, and the engine runs' common
settings and arena sizes."""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from ..compare.logits import EXACT, LogitsRule
from ..config.schema import CheckConfig
from ..contract import runspec
from ..contract.capabilities import Capabilities
from ..contract.memory import MemoryPool, arena_room_mib, run_need_mib
from ..contract.outputs import read_stats
from ..contract.process import EngineCommand, EngineRun, run_engine
from ..contract.promises import Promises
from ..contract.runspec import RunSpec
from ..gguf.facts import ModelFacts
from ..gguf.file import EXPERT_PARTS, ModelFile
from ..gguf.identity import file_sha256
from ..cgroups import available_memory_mib
from ..perf.machine import cpu_count
from ..reference.moe import MoEResult, moe_layer, shared_expert
from ..units import MiB, arena_mib
from .plan import CheckPlan

T = TypeVar("T")
# run.memory_mb auto: what is available at the start less what epmci itself grows by while
# engines run -- on the production model its model-file tables (0.9 GB at 248k tokens) and
# the reference's working arrays; counting only 10 % for it, the check was OOM-killed in 8 GiB.
MEMORY_RESERVE_MIB, MEMORY_RESERVE_SHARE = 2048.0, 0.1


def auto_arena_mb(cfg: CheckConfig, facts: ModelFacts, batch: int, memory_mib: float | None = None) -> float:
    """max(run.arena_fraction of all expert bytes -- or less, what a run leaves of
    `memory_mib` and of run.ram_budget_mb --, the minimum for `batch` + run.margin_experts)."""
    lo = facts.min_arena_bytes(batch, uniform=False, margin_slots=cfg.run.margin_experts)
    want = int(cfg.run.arena_fraction * facts.total_expert_bytes())
    room = arena_room(cfg, facts, batch, memory_mib)
    if room is not None:
        want = min(want, int(room * MiB))
    return arena_mib(max(lo, want))


def arena_room(cfg: CheckConfig, facts: ModelFacts, batch: int, memory_mib: float | None) -> float | None:
    """The largest arena (MiB) a run at `batch` can have within the check's memory and
    run.ram_budget_mb (None: no limit)."""
    typical = RunSpec("", batch=batch, ctx=cfg.engine.ctx)
    rooms = [r for r in (arena_room_mib(limit, typical, facts) for limit in (memory_mib, cfg.run.ram_budget_mb))
             if r is not None]
    return min(rooms) if rooms else None


@dataclass
class CheckContext:
    cfg: CheckConfig
    model_path: Path
    mf: ModelFile
    engine: EngineCommand                # with the features it declared (caps)
    workdir: Path
    caps: Capabilities
    suites_run: tuple[str, ...] = ()     # the suites this check runs (selected, and the engine can take them)
    jobs: int = 1                        # engine runs at once (run.jobs, or one per CPU)
    facts: ModelFacts = field(init=False)
    plan: CheckPlan = field(init=False)         # the settings derived from the model and the machine (plan.py)
    promises: Promises = field(init=False)      # every paged run is held to them (contract/promises.py)
    memory: MemoryPool = field(init=False)      # engine runs at once within the memory (contract/memory.py)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _sha: dict = field(default_factory=dict, init=False)
    _model_sha: str | None = field(default=None, init=False)
    _shared: dict = field(default_factory=dict, init=False)

    def __post_init__(self):
        self.facts = ModelFacts.of(self.mf, self.cfg.run.slot_align, self.cfg.run.slot_windows)
        self.promises = Promises.of(self.mf, self.cfg.run.slot_align, self.cfg.run.slot_windows)
        m = self.cfg.run.memory_mb
        available = available_memory_mib() if m == "auto" else None
        self.memory = MemoryPool(float(m) if m != "auto" else None if available is None else
                                 max(1.0, available - max(MEMORY_RESERVE_MIB, MEMORY_RESERVE_SHARE * available)))
        self.plan = CheckPlan.of(self.cfg, self.facts, self.jobs, self.memory.capacity, cpu_count())

    def run_need_mib(self, spec: RunSpec) -> float:
        """What the run is estimated to hold at its peak (contract/memory.py)."""
        return run_need_mib(spec, self.facts)

    # -------------------------------------------------------------- settings

    @property
    def threads(self) -> int:
        return self.cfg.engine.threads

    def logits_rule(self, against: str) -> LogitsRule:
        """How the engine's logits must agree with `against`: "reference" (epmci's NumPy
        reference; model_suite.compare) or "itself" (paged vs --no-pager, a switch run vs the
        resident run; e2e.compare). An engine that declares reference_exact (bit-identical to
        the reference, as the bundled engine is) is held to it: exact, whatever the settings."""
        if self.engine.has("reference_exact"):
            return EXACT
        section = {"reference": self.cfg.model_suite, "itself": self.cfg.e2e}[against]
        return LogitsRule(section.compare, section.max_kl)

    def arena_mb(self, batch: int | None = None) -> float:
        """The arena of the ordinary paged runs: run.arena_mb, or auto."""
        a = self.cfg.run.arena_mb
        if not isinstance(a, str):
            return float(a)
        return self.auto_arena_mb(batch)

    def auto_arena_mb(self, batch: int | None = None) -> float:
        return auto_arena_mb(self.cfg, self.facts, batch or self.cfg.run.batch, self.memory.capacity)

    def stress_arena_mb(self, uniform: bool) -> float:
        s = self.cfg.prefetch_stress
        return arena_mib(self.facts.min_arena_bytes(s.batch, uniform, s.margin_experts))

    def dir(self, name: str) -> Path:
        p = self.workdir / name
        p.mkdir(exist_ok=True)     # never parents: a work dir removed by a stopping epmci stays removed
        return p

    # -------------------------------------------------------------- engine runs

    def spec(self, prompt: str, *, n_predict: int, batch: int | None = None, threads: int | None = None,
             pager: bool = True, prefetch: bool = True, arena_mb: float | None = None) -> RunSpec:
        """A correctness run: the check's context size, threads, batch, arena and budget."""
        return RunSpec(prompt, n_predict=n_predict, batch=batch or self.cfg.run.batch, ctx=self.cfg.engine.ctx,
                       threads=threads or self.threads, pager=pager,
                       arena_mb=arena_mb if arena_mb is not None else self.arena_mb(batch),
                       ram_budget_mb=self.cfg.run.ram_budget_mb, prefetch=prefetch)

    def run(self, label: str, spec: RunSpec, out: Path, env: dict[str, str] | None = None,
            model: Path | None = None) -> EngineRun:
        """`spec` on the check's model (or `model`, e.g. a patched copy of it)."""
        # cwd stays the caller's: a relative --engine-cmd path means what the user typed
        with self.memory.hold(self.run_need_mib(spec)):
            return runspec.run(self.engine, model or self.model_path, spec, out, timeout=self.cfg.engine.timeout_s,
                               label=label, env=env, promises=None if model else self.promises)

    def stats(self, path: Path) -> list[dict]:
        """The run's stats records, each with every field the contract documents for this engine."""
        return read_stats(path, self.engine.stats_fields())

    def run_selftest(self, label: str, tests: list[tuple[int, int, int, Path]], out_dir: Path,
                     kernels: str | None = None) -> EngineRun:
        """One engine run of the selftests (layer, expert, rows, out) -- several only when the
        engine declares selftest_batch -- writing into out_dir."""
        args = runspec.selftest_args(self.model_path, tests, threads=self.threads, ctx=self.cfg.engine.ctx,
                                     batch=self.cfg.run.batch, arena_mb=self.arena_mb(), kernels=kernels)
        need = self.run_need_mib(RunSpec("", arena_mb=self.arena_mb(), dump_logits=False))
        with self.memory.hold(need):
            return run_engine(self.engine, args, timeout=self.cfg.engine.timeout_s, label=label, out_dir=out_dir)

    # -------------------------------------------------------------- reference facts

    def shared(self, key: object, make: Callable[[], T]) -> T:
        """make(), computed once per check for `key` however many tasks ask (the others wait):
        for results several independent tasks compare with, e.g. one resident run."""
        with self._lock:
            slot = self._shared.setdefault(key, [threading.RLock(), None, False])
        with slot[0]:
            if not slot[2]:
                slot[1], slot[2] = make(), True
            return slot[1]

    def reference_moe(self, layer: int, h: np.ndarray) -> MoEResult:
        """The reference MoE layer on rows h, memoized by their bytes: runs of one prompt under
        different settings dump the same inputs when the engine is right."""
        h = np.ascontiguousarray(h, dtype=np.float32)
        return self.shared(("moe", layer, hashlib.sha256(h.tobytes()).hexdigest()),
                           lambda: moe_layer(self.mf, layer, h))

    def reference_shared(self, layer: int, h: np.ndarray) -> np.ndarray:
        """The reference's gated shared expert on rows h, memoized as reference_moe."""
        h = np.ascontiguousarray(h, dtype=np.float32)
        return self.shared(("shared", layer, hashlib.sha256(h.tobytes()).hexdigest()),
                           lambda: shared_expert(self.mf, layer, h))

    def model_sha256(self) -> str:
        with self._lock:
            if self._model_sha is None:
                self._model_sha = file_sha256(self.model_path)
            return self._model_sha

    def expert_sha256(self, layer: int, expert: int) -> bytes:
        """sha256 of the expert's gate, up and down bytes, read from the file by offset."""
        key = (layer, expert)
        with self._lock:
            if key in self._sha:
                return self._sha[key]
        h = hashlib.sha256()
        for p in EXPERT_PARTS:
            h.update(self.mf.read_expert(layer, expert, p).tobytes())
        d = h.digest()
        with self._lock:
            self._sha[key] = d
        return d

    def find_shifted_read(self, layer: int, expert: int, sha: bytes, max_shift: int = 8192,
                          step: int = 32) -> tuple[str, int] | None:
        """Which read of the expert, off by how many bytes, gives slot bytes of this sha256:
        one part (gate, up or down) or all three read `shift` bytes from where they are, for
        shifts that are multiples of `step` up to `max_shift` either way; (part or "all", shift)."""
        ranges = [self.mf.expert_range(layer, expert, p) for p in EXPERT_PARTS]
        size = os.path.getsize(self.model_path)
        with open(self.model_path, "rb") as f:
            def at(r, shift: int) -> bytes | None:
                lo = r.offset + shift
                return os.pread(f.fileno(), r.n_bytes, lo) if 0 <= lo and lo + r.n_bytes <= size else None
            right = [at(r, 0) for r in ranges]
            for shift in (s for k in range(1, max_shift // step + 1) for s in (k * step, -k * step)):
                for which, parts in [(p, [at(r, shift) if i == j else right[i] for i, r in enumerate(ranges)])
                                     for j, p in enumerate(EXPERT_PARTS)] + [("all", [at(r, shift) for r in ranges])]:
                    if all(b is not None for b in parts) and hashlib.sha256(b"".join(parts)).digest() == sha:
                        return which, shift
        return None

    def find_expert_by_sha(self, sha: bytes, size: int) -> tuple[int, int] | None:
        """Which (layer, expert) of the file has these bytes (searching layers of that size)."""
        for il in range(self.facts.n_layer):
            if self.facts.expert_bytes[il] != size:
                continue
            for e in range(self.facts.n_expert):
                if self.expert_sha256(il, e) == sha:
                    return il, e
        return None
