"""What a suite is: a name, a title, the optional contract features it needs, and a plan of
independent tasks.

`plan(ctx)` returns Tasks (each runs engines and compares, returning CheckResults) and/or
ready CheckResults (e.g. a skip). Tasks must not depend on each other: the runner executes
them in any order, in parallel, and sorts results back into plan order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from ...contract.process import EngineRun
from ...perf.machine import cpu_flags
from ..context import CheckContext
from ..result import FAIL, SKIP, CheckResult


@dataclass
class Task:
    suite: str
    name: str
    fn: Callable[[], list[CheckResult]]
    names: list[str] = field(default_factory=list)   # the results it will produce (for errors)
    cost: float = 1.0                                # rough engine runs; big tasks start first
    exclusive: bool = False                          # runs alone, after every other task (timing runs)
    unit: str = ""                                   # what a shard runs whole (set by the runner; check/shard.py)


class Suite(Protocol):
    name: str
    title: str
    description: str
    requires: tuple[str, ...]     # optional features of the contract it needs (others: SKIP, engine lacks it)
    together: str                 # optional: why its tasks must run on one machine (one shard unit, check/shard.py)

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]: ...


def prompt_label(i: int, prompt: str, prefix: str = "prompt ") -> str:
    """A result's name for the i-th prompt of a list: prefix, number, the prompt cut to 24."""
    p = prompt if len(prompt) <= 24 else prompt[:21] + "..."
    return f"{prefix}{i + 1} {p!r}"


def run_failed(suite: str, names: list[str], run: EngineRun | None, what: str = "",
               reason: str | None = None) -> list[CheckResult]:
    """Every result that depended on a failed engine run fails with the run's reason (or
    `reason`, e.g. its output was unusable)."""
    reason = reason or (run.failure() if run else None) or "engine run failed"
    if run is None:
        return [CheckResult(suite, n, FAIL, f"{what}{reason}") for n in names]
    props = {"returncode": run.returncode, "timed_out": run.timed_out, "run_seconds": round(run.seconds, 3)}
    return [CheckResult(suite, n, FAIL, f"{what}{reason}", dict(props), run.seconds,
                        run.stderr_tail(), f"command: {run.command_line()}") for n in names]


def kernel_paths(ctx: CheckContext) -> list[str | None]:
    """The kernel paths a suite runs: None (the engine's default), then kernel.paths -- auto:
    every one the engine declares (`kernel_paths`); a list as it is."""
    p = ctx.cfg.kernel.paths
    return [None, *(ctx.caps.kernel_paths if p == "auto" else p)]


def path_suffix(path: str | None) -> str:
    return f" [{path}]" if path else ""


def path_refused(suite: str, names: list[str], run: EngineRun, path: str | None,
                 ctx: CheckContext) -> list[CheckResult] | None:
    """The engine refused a declared kernel path (exit 2, one line naming --kernels): each
    result a SKIP when this CPU lacks a flag the path needs, or when the engine did not say
    which flags it needs (its word is all there is); a FAIL when this CPU has every flag it
    declared -- a path it claims and does not run. None when that is not what happened."""
    if not path or run.returncode != 2 or run.timed_out or "--kernels" not in run.stderr:
        return None
    line = (run.failure() or "").split(": ", 1)[-1]
    needs = ctx.caps.kernel_cpu_flags.get(path)
    missing = None if needs is None else [f for f in needs if f not in cpu_flags()]
    if needs is None:
        why = (f"this CPU cannot run kernel path {path}, by the engine's word (it declares no "
               f"kernel_cpu_flags for it, so the gate cannot tell): {line}")
    elif missing:
        why = f"this CPU cannot run kernel path {path}: it lacks {', '.join(missing)}: {line}"
    else:
        return [CheckResult(suite, n, FAIL, f"the engine refused kernel path {path}, which it declares, on a CPU "
                            f"with every flag it says the path needs ({', '.join(needs) or 'none'}): {line}",
                            {"kernels": path}, run.seconds, run.stderr_tail(), f"command: {run.command_line()}")
                for n in names]
    return [CheckResult(suite, n, SKIP, why, {"kernels": path, "skipped_by": "cpu"}, run.seconds) for n in names]
