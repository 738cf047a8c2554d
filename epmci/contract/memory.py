"""How many engine runs fit the memory at once.

A check runs engine processes in parallel (one per CPU by default). On a model near the
machine's size -- the production model in an 8 GiB runner -- two paged runs do not fit
together, and the kernel kills one (SIGKILL: a failure the engine did not cause). So every
run first takes its estimated need from a pool sized by the memory available when the
check starts, and gives it back when it ends: runs that fit together run together, the
others wait in turn, and a run larger than the whole pool runs alone.
"""

from __future__ import annotations

import collections
import threading
from contextlib import contextmanager
from typing import Iterator

from ..gguf.facts import ModelFacts
from ..units import MiB, arena_mib
from .runspec import RunSpec

# Interpreter, NumPy, numba and its compiled kernels: the bundled engine's RSS before any
# weight is read is ~200 MiB on the ci model (the budget's "runtime"), with headroom; the
# tokenizer's tables grow with the vocabulary (~1.2 GB of runtime at 248k tokens, measured).
RUNTIME_MIB = 400.0
RUNTIME_PER_TOKEN = 4096        # bytes per vocabulary entry
DEFAULT_ARENA_FRACTION = 0.25   # docs/engine-contract.md: the default arena
ROOM_SHARE = 0.95               # of what the memory leaves, for an arena sized to fit it


def fixed_need_mib(spec: RunSpec, facts: ModelFacts) -> float:
    """A paged run's memory but its arena: resident weights, the logits it keeps, runtime."""
    logits = 2 * spec.ctx * facts.n_vocab * 4 if spec.dump_logits else 0
    runtime = RUNTIME_MIB * MiB + RUNTIME_PER_TOKEN * facts.n_vocab
    return (facts.file_bytes - facts.total_expert_bytes() + logits + runtime) / MiB


def min_arena_mib(spec: RunSpec, facts: ModelFacts) -> float:
    """The smallest --arena-mb the engine must take for `spec`'s batch and slot layout."""
    uniform = spec.env.get("SDQ_FORCE_UNIFORM_SLOT") == "1"
    return arena_mib(facts.min_arena_bytes(spec.batch, uniform))


def run_need_mib(spec: RunSpec, facts: ModelFacts) -> float:
    """Upper estimate of one run's memory: the above plus its arena (a run without the
    pager maps the whole file, and every expert page it touches comes into memory); never
    more than a RAM budget the run is held to."""
    if not spec.pager:
        return fixed_need_mib(spec, facts) + facts.total_expert_bytes() / MiB
    arena = spec.arena_mb if spec.arena_mb is not None else DEFAULT_ARENA_FRACTION * facts.total_expert_bytes() / MiB
    need = fixed_need_mib(spec, facts) + arena
    return need if spec.ram_budget_mb is None else min(need, spec.ram_budget_mb)


def arena_room_mib(memory_mib: float | None, spec: RunSpec, facts: ModelFacts) -> float | None:
    """The largest arena a run like `spec` can have within `memory_mib` (None: no limit).
    An arena fraction of a 20 GB model's experts plus its resident weights can be more than
    the runner has: sized blindly, the run is refused or killed."""
    if memory_mib is None:
        return None
    return ROOM_SHARE * (memory_mib - fixed_need_mib(spec, facts))


class MemoryPool:
    """`capacity` MiB shared by the runs that hold part of it; None: no limit. Runs are let
    in first come, first served, so a large run is not starved by small ones."""

    def __init__(self, capacity_mib: float | None):
        self.capacity = capacity_mib
        self.used = 0.0
        self.peak_runs = 0
        self._running = 0
        self._cond = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()

    @contextmanager
    def hold(self, need_mib: float) -> Iterator[None]:
        if self.capacity is None:
            yield
            return
        take = min(need_mib, self.capacity)   # larger than the pool: it waits for an empty pool
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            while self._queue[0] is not ticket or (self._running and self.used + take > self.capacity):
                self._cond.wait()
            self._queue.popleft()
            self.used += take
            self._running += 1
            self.peak_runs = max(self.peak_runs, self._running)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self.used -= take
                self._running -= 1
                self._cond.notify_all()
