"""The suites of `epmci check`, in run and report order. A suite is a module with a SUITE
object (name, title, description, plan(ctx)) listed here; its name must also be in
epmci.config.schema.SUITE_NAMES (the names settings are validated against; a test keeps the
two equal)."""

from __future__ import annotations

from . import budget, contract, determinism, e2e, kernel, layer, model, perf, prefetch_stress, switches
from .base import Suite, Task

SUITES: dict[str, Suite] = {s.name: s for s in (contract.SUITE, kernel.SUITE, layer.SUITE, prefetch_stress.SUITE,
                                                  determinism.SUITE, e2e.SUITE, model.SUITE, switches.SUITE,
                                                  budget.SUITE, perf.SUITE)}

__all__ = ["SUITES", "Suite", "Task"]
