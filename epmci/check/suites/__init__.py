"""The suites of `epmci check`, in run and report order. A new suite (e.g. perf) is a module
with a SUITE object (name, title, description, plan(ctx)) added to SUITES."""

from __future__ import annotations

from . import determinism, e2e, kernel, layer, perf, stress
from .base import Suite, Task

SUITES: dict[str, Suite] = {s.name: s for s in (kernel.SUITE, layer.SUITE, stress.SUITE,
                                                  determinism.SUITE, e2e.SUITE, perf.SUITE)}

__all__ = ["SUITES", "Suite", "Task"]
