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

from ..units import MiB
from .runspec import RunSpec

# Interpreter, NumPy, numba and its compiled kernels: the bundled engine's RSS before any
# weight is read is ~200 MiB on the ci model (the budget's "runtime"), with headroom.
RUNTIME_MIB = 400.0
DEFAULT_ARENA_FRACTION = 0.25   # docs/engine-contract.md: the default arena


def run_need_mib(spec: RunSpec, file_bytes: int, expert_bytes: int, n_vocab: int) -> float:
    """Upper estimate of one run's memory: its resident weights, its arena (a run without
    the pager maps the whole file, and every expert page it touches comes into memory), the
    logits it keeps, the runtime; never more than a RAM budget the run is held to."""
    if spec.pager:
        arena = spec.arena_mb * MiB if spec.arena_mb is not None else DEFAULT_ARENA_FRACTION * expert_bytes
        weights = file_bytes - expert_bytes + arena
    else:
        weights = file_bytes
    logits = 2 * spec.ctx * n_vocab * 4 if spec.dump_logits else 0
    need = (weights + logits) / MiB + RUNTIME_MIB
    if spec.pager and spec.ram_budget_mb is not None:
        need = min(need, spec.ram_budget_mb)
    return need


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
