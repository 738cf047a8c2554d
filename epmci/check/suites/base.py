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


def path_refused(suite: str, names: list[str], run: EngineRun, path: str | None) -> list[CheckResult] | None:
    """A declared kernel path this CPU cannot run: the engine refused --kernels (exit 2),
    each result a SKIP with its line; None when that is not what happened."""
    if not path or run.returncode != 2 or run.timed_out or "--kernels" not in run.stderr:
        return None
    why = f"this CPU cannot run kernel path {path}: {(run.failure() or '').split(': ', 1)[-1]}"
    return [CheckResult(suite, n, SKIP, why, {"kernels": path, "skipped_by": "cpu"}, run.seconds) for n in names]
