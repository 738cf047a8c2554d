"""The settings whose default is `auto`, made concrete from the model's facts and the
machine's memory: one place, so a 1 GB and a 20 GB model both run on the defaults, and
every consumer (check, golden update, bench) sees the same numbers. What was derived is
returned as lines, printed at the start of a check and kept in its report.

The rules (each a cost or a size the model's facts decide, never a preset's value):
- engine.timeout_s: BASE_TIMEOUT_S, plus reading the whole model file once at SLOW_READ
  (a shared runner's slow disk) -- what a run at most has to wait for on top of its work.
- perf.ram_budget_mb: the perf run's need (resident weights, runtime, its arena at
  perf.arena_fraction; contract/memory.py), at least MIN_PERF_BUDGET_MIB, and at most
  PERF_MEMORY_SHARE of the machine's memory (its cgroup limit, else MemTotal: stable
  between a profile's runners, unlike what is free at the moment), in 100 MiB steps (the
  need rounded up, the cap down); the arena gives way to the budget. The share leaves what the check's memory
  pool keeps back for epmci (2 GiB, check/context.py) and what epmci already holds: at
  0.6 of 8 GiB the budget (4,900 MiB) was over the pool's 4,892 and the perf suite refused it. The golden baselines of a profile are
  recorded with it, so it must come out the same on every runner of the profile.
- perf.golden_rows: as many logits rows per prompt as fit GOLDEN_ROW_BYTES (a
  248k-token vocabulary: 1 row), at most MAX_GOLDEN_ROWS.
- model_suite.max_positions: the reference recomputes every position from the model's
  active weights (dense ones and n_expert_used experts per layer); the prompt is capped
  where that stream reaches REFERENCE_BYTES, and never below 4 micro-batches.
"""

from __future__ import annotations

import copy

from ..contract.memory import fixed_need_mib
from ..contract.runspec import RunSpec
from ..gguf.facts import ModelFacts
from ..units import MiB
from .schema import CheckConfig

AUTO = "auto"
BASE_TIMEOUT_S = 300.0
SLOW_READ = 32 * MiB             # bytes/s
MIN_PERF_BUDGET_MIB = 1024.0
PERF_MEMORY_SHARE = 0.55         # the rest: epmci (its 2 GiB reserve, check/context.py), the page cache
GOLDEN_ROW_BYTES = 256 * 1024
MAX_GOLDEN_ROWS = 8
REFERENCE_BYTES = 200e9          # ~2-3 minutes of the NumPy reference on a 2-core runner
MIN_MICRO_BATCHES = 4


def active_bytes(facts: ModelFacts) -> int:
    """Weight bytes one position's forward reads: every dense tensor, the used experts."""
    dense = facts.file_bytes - facts.total_expert_bytes()
    return dense + sum(facts.expert_bytes) * facts.n_expert_used


def resolve(cfg: CheckConfig, facts: ModelFacts, memory_limit_mib: float | None) -> tuple[CheckConfig, list[str]]:
    """A copy of cfg with every `auto` above made concrete for this model and machine, and
    one line per derived value saying why."""
    out, derived = copy.deepcopy(cfg), []
    if out.engine.timeout_s == AUTO:
        out.engine.timeout_s = round(BASE_TIMEOUT_S + facts.file_bytes / SLOW_READ)
        derived.append(f"engine.timeout_s {out.engine.timeout_s:g} s: {BASE_TIMEOUT_S:g} s and the "
                       f"{facts.file_bytes / MiB:,.0f} MiB model read once at {SLOW_READ / MiB:g} MiB/s")
    pc = out.perf
    if pc.ram_budget_mb == AUTO:
        spec = RunSpec("", batch=pc.batch, ctx=pc.ctx)
        need = fixed_need_mib(spec, facts) + pc.arena_fraction * facts.total_expert_bytes() / MiB
        budget = -(-need // 100) * 100                         # the need, up to 100 MiB steps
        why = f"the perf run's need at a {pc.arena_fraction:g} arena, {need:,.0f} MiB"
        if memory_limit_mib is not None and budget > PERF_MEMORY_SHARE * memory_limit_mib:
            budget = PERF_MEMORY_SHARE * memory_limit_mib // 100 * 100    # the cap, down
            why += f", capped at {PERF_MEMORY_SHARE:g} of the machine's {memory_limit_mib:,.0f} MiB (the arena gives way)"
        pc.ram_budget_mb = float(max(MIN_PERF_BUDGET_MIB, budget))
        derived.append(f"perf.ram_budget_mb {pc.ram_budget_mb:g}: {why}")
    if pc.golden_rows == AUTO:
        pc.golden_rows = max(1, min(MAX_GOLDEN_ROWS, GOLDEN_ROW_BYTES // (4 * max(1, facts.n_vocab))))
        derived.append(f"perf.golden_rows {pc.golden_rows}: {facts.n_vocab}-token rows within "
                       f"{GOLDEN_ROW_BYTES // 1024} KiB per prompt")
    ms = out.model_suite
    if ms.max_positions == AUTO:
        per = active_bytes(facts)
        ms.max_positions = max(MIN_MICRO_BATCHES * ms.batch, int(REFERENCE_BYTES // per))
        derived.append(f"model_suite.max_positions {ms.max_positions}: the reference reads "
                       f"{per / MiB:,.1f} MiB of weights a position, {REFERENCE_BYTES / 1e9:g} GB in all, "
                       f"at least {MIN_MICRO_BATCHES} micro-batches of {ms.batch}")
    return out, derived
