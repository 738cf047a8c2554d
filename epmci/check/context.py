"""What every suite needs: the config, the model (as the reference sees it), the engine
command, a work directory, and the engine runs' common flags and arena sizes."""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..config import CheckConfig
from ..engine_runner import EngineCommand, EngineRun, run_engine
from ..gguf.file import EXPERT_PARTS, ModelFile

MiB = 1 << 20


def round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def slot_part_bytes(offset: int, n_bytes: int, n_expert: int, file_size: int, align: int,
                    windows: bool) -> int:
    """Slot bytes of one expert part as docs/engine-contract.md defines them: with aligned
    windows, a part whose size is a multiple of `align` takes the aligned file range that
    covers it (when the last expert's range ends inside the file); else its own bytes,
    rounded up to `align`."""
    head = offset % align
    window = round_up(head + n_bytes, align)
    if windows and head and n_bytes % align == 0 and offset - head + (n_expert - 1) * n_bytes + window <= file_size:
        return window
    return round_up(n_bytes, align)


@dataclass
class ModelFacts:
    """Expert layout facts derived from the model file (never from the engine)."""
    n_layer: int
    n_expert: int
    n_expert_used: int
    n_embd: int
    types: list[tuple[str, str, str]]   # per layer: gate, up, down quant type names
    expert_bytes: list[int]             # per layer: gate + up + down bytes
    slot_bytes: list[int]               # per layer: the slot bytes of its three parts

    @classmethod
    def of(cls, mf: ModelFile, align: int, windows: bool = True) -> "ModelFacts":
        hp = mf.hp
        file_size = os.path.getsize(mf.path)
        types, eb, sb = [], [], []
        for il in range(hp.n_layer):
            parts = [mf.expert_range(il, 0, p) for p in EXPERT_PARTS]
            types.append(tuple(p.qtype.name for p in parts))
            eb.append(sum(p.n_bytes for p in parts))
            sb.append(sum(slot_part_bytes(p.offset, p.n_bytes, hp.n_expert, file_size, align, windows)
                          for p in parts))
        return cls(hp.n_layer, hp.n_expert, hp.n_expert_used, hp.n_embd, types, eb, sb)

    def describe_layer(self, il: int) -> str:
        return f"{'/'.join(self.types[il])}, {self.expert_bytes[il]} B"

    # -------------------------------------------------------------- arena sizes

    def slot_classes(self, uniform: bool) -> list[int]:
        """Slot sizes of the arena: one class (the largest) when uniform or when the model has
        one size; else the largest and the second largest (mixed)."""
        sizes = sorted(set(self.slot_bytes))
        return [sizes[-1]] if uniform or len(sizes) == 1 else sizes[-2:]

    def min_arena_bytes(self, batch: int, uniform: bool, margin_slots: int = 0) -> int:
        """One layer's routed experts for one micro-batch, min(n_expert, batch*top_k) slots,
        in every slot class (a small layer cannot borrow a large slot, nor the reverse)."""
        need = min(self.n_expert, batch * self.n_expert_used) + margin_slots
        return sum(need * s for s in self.slot_classes(uniform))

    def total_expert_bytes(self) -> int:
        return sum(self.expert_bytes) * self.n_expert


@dataclass
class CheckContext:
    cfg: CheckConfig
    model_path: Path
    mf: ModelFile
    engine: EngineCommand
    workdir: Path
    facts: ModelFacts = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _sha: dict = field(default_factory=dict, init=False)

    def __post_init__(self):
        self.facts = ModelFacts.of(self.mf, self.cfg.run.slot_align, self.cfg.run.slot_windows)

    # -------------------------------------------------------------- settings

    @property
    def threads(self) -> int:
        return self.cfg.engine.threads

    @property
    def threads_alt(self) -> int:
        t = self.cfg.determinism.threads_alt
        return t if t else (1 if self.threads > 1 else 2)

    def arena_mb(self, batch: int | None = None) -> float:
        """The arena of the ordinary paged runs: run.arena_mb, or auto."""
        a = self.cfg.run.arena_mb
        if not isinstance(a, str):
            return float(a)
        return self.auto_arena_mb(batch)

    def auto_arena_mb(self, batch: int | None = None) -> float:
        """max(run.arena_fraction of all expert bytes, the minimum for `batch` + margin)."""
        b = batch or self.cfg.run.batch
        lo = self.facts.min_arena_bytes(b, uniform=False, margin_slots=self.cfg.prefetch_stress.margin_experts)
        want = max(lo, int(self.cfg.run.arena_fraction * self.facts.total_expert_bytes()))
        return mib(want)

    def stress_arena_mb(self, uniform: bool) -> float:
        s = self.cfg.prefetch_stress
        return mib(self.facts.min_arena_bytes(s.batch, uniform, s.margin_experts))

    def dir(self, name: str) -> Path:
        p = self.workdir / name
        p.mkdir(parents=True, exist_ok=True)
        return p

    # -------------------------------------------------------------- engine runs

    def engine_args(self, prompt: str, out: Path, *, n_predict: int, batch: int | None = None,
                    threads: int | None = None, pager: bool = True, prefetch: bool = True,
                    arena_mb: float | None = None) -> list[str]:
        """The common flags: greedy, raw prompt, stats and logits into `out`."""
        args = ["-m", str(self.model_path), "-p", prompt, "-n", str(n_predict),
                "-c", str(self.cfg.engine.ctx), "-t", str(threads or self.threads),
                "-b", str(batch or self.cfg.run.batch), "--temp", "0", "--seed", "0",
                "--no-chat", "--no-interactive",
                "--stats-file", str(out / "stats.jsonl"),
                "--dump-logits", "--logits-out", str(out / "logits.bin")]
        if pager:
            args += ["--arena-mb", f"{arena_mb if arena_mb is not None else self.arena_mb(batch):.6f}"]
            if self.cfg.run.ram_budget_mb is not None:
                args += ["--ram-budget-mb", f"{self.cfg.run.ram_budget_mb:g}"]
            if not prefetch:
                args.append("--no-prefetch")
        else:
            args.append("--no-pager")
        return args

    def run(self, label: str, args: list[str], env: dict[str, str] | None = None) -> EngineRun:
        e = dict(env or {})
        # numba refuses more threads than NUMBA_NUM_THREADS (default: the CPU count)
        if "NUMBA_NUM_THREADS" not in os.environ:
            e.setdefault("NUMBA_NUM_THREADS", str(max(self.threads, self.threads_alt, os.cpu_count() or 1)))
        # cwd stays the caller's: a relative --engine-cmd path means what the user typed
        return run_engine(self.engine, args, timeout=self.cfg.engine.timeout_s, label=label, env=e)

    # -------------------------------------------------------------- reference facts

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

    def find_expert_by_sha(self, sha: bytes, size: int) -> tuple[int, int] | None:
        """Which (layer, expert) of the file has these bytes (searching layers of that size)."""
        for il in range(self.facts.n_layer):
            if self.facts.expert_bytes[il] != size:
                continue
            for e in range(self.facts.n_expert):
                if self.expert_sha256(il, e) == sha:
                    return il, e
        return None


def mib(n_bytes: int) -> float:
    """Bytes -> MiB, rounded up in the 6th decimal so the engine's byte count is >= n_bytes."""
    return (n_bytes * 1_000_000 + MiB - 1) // MiB / 1_000_000 + 1e-6
