"""run_check(config) -> CheckReport: resolve the model, build the engine, ask what it can do
(--contract-info), plan every selected suite (a suite needing a feature the engine lacks is
one SKIP result saying so), run the tasks in a thread pool (each engine run is a subprocess),
collect results.

Verdicts never depend on completion order: every result is decided inside its own task,
and results are sorted back into plan order. A task that raises becomes an `error` result
(fail closed), never a pass.
"""

from __future__ import annotations

import os
import platform
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable

from ..config.schema import CheckConfig
from ..contract.build import WARM_UP_BATCH, BuildResult, build_engine
from ..contract.process import EngineCommand
from ..errors import InputError
from ..gguf.facts import ModelFacts
from ..gguf.file import ModelFile
from ..gguf.identity import model_key
from ..perf.machine import cpu_count, current_commit, fingerprint
from ..perf.settings import for_model
from ..synth.presets import PRESETS
from ..synth.store import cached_model_path, resolve_model
from .capabilities import declared, engine_for_model, lacks
from .context import CheckContext, auto_arena_mb
from .result import ERROR, FAIL, PASS, SKIP, CheckReport, CheckResult, SuiteInfo
from .shard import Shard, Unit, loads, partition, settings_digest, unit_key
from .suites import SUITES
from .suites.base import Task
from .workdirs import KEEP_FAILED, finish_workdir, new_workdir

Progress = Callable[[CheckResult], None]


def build_for_check(cfg: CheckConfig, engine: EngineCommand, model_path: Path, facts: ModelFacts,
          workdir: Path | None = None) -> BuildResult:
    """Build the engine the check will run, warming it up on the check's model."""
    return build_engine(engine, model_path, auto_arena_mb(cfg, facts, WARM_UP_BATCH), build_cmd=cfg.engine.build_cmd,
                        build_timeout=cfg.engine.build_timeout_s, run_timeout=cfg.engine.timeout_s, workdir=workdir)


def engine_at_fault(b: BuildResult, cfg: CheckConfig, engine: EngineCommand, mf: ModelFile) -> bool:
    """A failed build is the engine's when it broke, or refused (exit 2) a warm-up at the
    contract's settings (no flag setting changed by the user) on a model it declares it runs."""
    if b.engine_failed:
        return True
    if not b.refused or changed_engine_settings(cfg):
        return False
    caps, _ = declared(cfg, engine)
    return caps is not None and engine_for_model(caps, mf) is None


def build_result(b: BuildResult, at_fault: bool) -> CheckResult:
    """The build as the first result of a check: a failure of the engine when its build or
    warm-up broke (exit 1), an error when epmci could not run it at all (exit 2). Every
    shard of a check builds: its unit is not partitioned."""
    status = PASS if b.ok else FAIL if at_fault else ERROR
    message = b.message if b.ok or not at_fault else f"the engine failed before any check: {b.message}"
    return CheckResult("build", b.name, status, message, b.props, b.seconds, b.stderr_tail, b.details,
                       unit=f"build/{b.name}")


class ToolError(Exception):
    """epmci cannot run the check (exit 2): the reason goes into the report's tool_error."""


def run_check(cfg: CheckConfig, progress: Progress | None = None, *, build: bool = True,
              workdir: str | os.PathLike | None = None, keep_work: bool = False,
              note: Callable[[str], None] | None = None, shard: Shard | None = None,
              durations: dict[str, float] | None = None, fail_fast: bool = False,
              keep_failed: int = KEEP_FAILED) -> CheckReport:
    """Run every suite in cfg.suites (with `shard`, only its part of them, balanced by
    `durations`; check/shard.py); never raises for engine or model problems (they end up
    in the report: failed results, or tool_error for exit 2). `fail_fast`: after the first
    failure, the tasks not yet started are SKIPs saying so (the verdict is already FAIL).
    The engine outputs are removed after a pass, kept after a failure (of those in the same
    place, the newest `keep_failed`; check/workdirs.py) and always with `keep_work`."""
    t_start = time.perf_counter()
    report = CheckReport()
    say = note or (lambda s: None)
    engine = EngineCommand.of_settings(cfg.engine)
    jobs = cfg.run.jobs or cpu_count()
    report.meta.update(config=cfg.source, engine=engine.describe(), fast=cfg.fast, jobs=jobs,
                       suites=",".join(cfg.suites), host=platform.node(), python=platform.python_version())

    def emit(r: CheckResult) -> None:
        report.results.append(r)
        if progress:
            progress(r)

    wd: Path | None = None
    try:
        model_path, mf = _model(cfg, say)
        report.meta.update(model=str(model_path), model_setting=cfg.model, profile=cfg.perf.profile,
                           machine=fingerprint(model_path.parent))
        # what shards of one check share (check/merge.py compares it), before the machine's derivations
        report.meta["identity"] = {"commit": current_commit(), "model": model_key(mf),
                                   "settings": settings_digest(cfg.to_dict())}
        cfg, derived = for_model(cfg, mf)
        report.meta["settings_derived"] = derived
        for line in derived:
            say(f"derived {line}")
        report.meta["limits"] = run_limits(cfg)
        say("limits of every engine run: " + ", ".join(f"{k} {v:g}" for k, v in report.meta["limits"].items()))
        wd = new_workdir(workdir, live=not keep_work)
        report.meta["workdir"] = str(wd)
        if build and not _build(cfg, engine, model_path, mf, wd, report, emit, say):
            return report          # the engine broke at its build or start: that is the verdict
        ctx = _context(cfg, engine, model_path, mf, wd, report, jobs)
        report.meta["plan"] = ctx.plan.to_dict()
        report.meta["fail_fast"] = fail_fast
        say(ctx.plan.text())
        _run_suites(ctx, cfg, jobs, report, emit, progress, say, shard, durations, fail_fast)
        report.meta.update(memory_mb=None if ctx.memory.capacity is None else round(ctx.memory.capacity),
                           most_runs_at_once=ctx.memory.peak_runs)
        refusal = engine_refuses_everything(report.results)
        if refusal:
            changed = changed_engine_settings(cfg)
            if changed:
                raise ToolError(f"the engine refused every run (exit 2) with {', '.join(changed)} set: {refusal}")
            # on a model epmci validated and the engine declares it runs, at the contract's
            # settings: the refusal is the engine's defect, and the failed runs its verdict
            report.meta["engine_refused_every_run"] = refusal
    except ToolError as e:
        report.tool_error = str(e)
    finally:
        report.seconds = time.perf_counter() - t_start
        if wd is not None:
            report.meta.update(finish_workdir(wd, "asked" if keep_work else None if report.passed else "failed",
                                              keep_failed))
    return report


def _model(cfg: CheckConfig, say: Callable[[str], None]) -> tuple[Path, ModelFile]:
    """The check's model file (a preset is made on first use), validated."""
    try:
        if cfg.model in PRESETS and not Path(cfg.model).exists() and not cached_model_path(cfg.model).exists():
            say(f"making the {cfg.model!r} preset model (first use) ...")
        model_path = resolve_model(cfg.model)
        return model_path, ModelFile(model_path)
    except InputError as e:
        raise ToolError(f"{e.where}: {e.problem}") from None


def run_limits(cfg: CheckConfig) -> dict[str, float]:
    """What bounds each engine run (docs/CORRECTNESS.md, "Limits"), as the report states them."""
    e = cfg.engine
    return {"engine.timeout_s": float(e.timeout_s), "engine.max_output_mb": float(e.max_output_mb),
            "engine.max_disk_mb": float(e.max_disk_mb)}


# Settings that reach the engine as flags (arena, budget, batch, context, threads): when the
# user changed one, an engine refusing every run may be refusing that value.
ENGINE_FLAG_SETTINGS = (("run", "arena_mb"), ("run", "arena_fraction"), ("run", "ram_budget_mb"),
                        ("run", "batch"), ("engine", "ctx"), ("engine", "threads"))


def changed_engine_settings(cfg: CheckConfig) -> list[str]:
    """The ENGINE_FLAG_SETTINGS that differ from their defaults, named."""
    default = CheckConfig()
    return [f"{a}.{b}={getattr(getattr(cfg, a), b)}" for a, b in ENGINE_FLAG_SETTINGS
            if getattr(getattr(cfg, a), b) != getattr(getattr(default, a), b)]


def _build(cfg: CheckConfig, engine: EngineCommand, model_path: Path, mf: ModelFile, wd: Path,
           report: CheckReport, emit: Progress, say: Callable[[str], None]) -> bool:
    """Build and warm the engine up first (an external engine may only exist once built):
    True when the suites can run; False when the engine broke (a failed result); ToolError
    when epmci cannot run it (refused, or a command that cannot be started)."""
    say(f"building {engine.describe()} ...")
    b = build_for_check(cfg, engine, model_path, ModelFacts.of(mf, cfg.run.slot_align, cfg.run.slot_windows), wd)
    report.suites.append(SuiteInfo("build", "engine build"))
    report.meta["build_seconds"] = round(b.seconds, 3)
    at_fault = engine_at_fault(b, cfg, engine, mf)
    emit(build_result(b, at_fault))
    if not b.ok and not at_fault:
        raise ToolError(f"engine build failed: {b.message}")
    return b.ok


def _context(cfg: CheckConfig, engine: EngineCommand, model_path: Path, mf: ModelFile, wd: Path,
             report: CheckReport, jobs: int) -> CheckContext:
    """The suites' context: the engine with what it declared, on a model it says it runs."""
    caps, why = declared(cfg, engine)
    if caps is None:
        raise ToolError(why)
    report.meta["engine_contract"] = caps.to_dict()
    unusable = engine_for_model(caps, mf)
    if unusable:
        raise ToolError(f"{model_path}: {unusable}")
    return CheckContext(cfg, model_path, mf, engine.with_features(caps.features), wd, caps, jobs=jobs)


def _run_suites(ctx: CheckContext, cfg: CheckConfig, jobs: int, report: CheckReport, emit: Progress,
                progress: Progress | None, say: Callable[[str], None], shard: Shard | None = None,
                durations: dict[str, float] | None = None, fail_fast: bool = False) -> None:
    report.meta["suites_not_selected"] = [s for s in SUITES if s not in cfg.suites]
    try:
        suites, ready, tasks = _plan(ctx, cfg)
    except InputError as e:        # a suite's input is unusable (e.g. a corrupt golden file): exit 2
        raise ToolError(f"{e.where}: {e.problem}") from None
    if shard is not None:
        ready, tasks = _shard_part(shard, durations, ready, tasks, report, say)
    n_checks = len(ready) + sum(max(1, len(t.names)) for _, t in tasks)
    planned = getattr(progress, "planned", None)
    if planned:
        planned(n_checks + len(report.results))
    report.suites += suites
    for r in ready:
        emit(r)
    say(f"{len(tasks)} tasks ({n_checks - len(ready)} checks) on {jobs} worker(s)")
    spans: dict[str, list[float]] = {}
    unit_seconds = {r.unit: 0.0 for r in ready}
    _execute(tasks, jobs, emit, spans, unit_seconds, fail_fast)
    report.meta["suite_seconds"] = {suite: round(end - start, 1) for suite, (start, end) in spans.items()}
    report.meta["unit_seconds"] = {k: round(v, 2) for k, v in unit_seconds.items()}


def _units(ready: list[CheckResult], tasks: list[tuple[int, Task]]) -> list[Unit]:
    """The plan's units in plan order (check/shard.py): a suite that runs whole is one."""
    by_key: dict[str, Unit] = {}
    items = sorted([(r.order, r.suite, r.unit, 0.0, False) for r in ready] +
                   [(o, t.suite, t.unit, t.cost, t.exclusive) for o, t in tasks])
    for _, suite, key, cost, timed in items:
        u = by_key.get(key)
        together = getattr(SUITES.get(suite), "together", "")
        # a suite that runs whole is keyed to the runner (perf: timing, RSS vs golden): the last shard's
        by_key[key] = Unit(key, cost + (u.cost if u else 0.0), bool(together) or timed or (u.timed if u else False),
                           together)
    return list(by_key.values())


def _shard_part(shard: Shard, durations: dict[str, float] | None, ready: list[CheckResult],
                tasks: list[tuple[int, Task]], report: CheckReport, say: Callable[[str], None]
                ) -> tuple[list[CheckResult], list[tuple[int, Task]]]:
    """This shard's ready results and tasks; the partition stated in meta.shard."""
    units = _units(ready, tasks)
    where = partition(units, shard.count, durations)
    mine = {k for k, s in where.items() if s == shard.index}
    expected = loads(units, where, shard.count, durations)
    report.meta["shard"] = {
        "index": shard.index, "count": shard.count, "units": [u.key for u in units],
        "assigned": [u.key for u in units if u.key in mine],
        "together": {u.key: u.together for u in units if u.together},
        "balanced_by": "recorded durations" if durations else "estimated engine runs",
        "expected_seconds": [round(x, 1) for x in expected]}
    say(f"shard {shard}: {len(mine)} of {len(units)} units (expected load "
        f"{expected[shard.index - 1]:.0f} of {sum(expected):.0f}"
        f"{' s' if durations else ' engine runs'})")
    return [r for r in ready if r.unit in mine], [(o, t) for o, t in tasks if t.unit in mine]

REFUSED = "engine refused to run (exit 2): "


def engine_refuses_everything(results: list[CheckResult]) -> str | None:
    """The engine's one refusal line when every check failed on that same refusal: a model or
    a setting the engine cannot use is the tool not being able to run (exit 2), not a verdict
    on the engine. None otherwise."""
    lines = {r.message.split(REFUSED, 1)[1] for r in results if r.status == FAIL and REFUSED in r.message}
    failed = [r for r in results if r.status not in (PASS, SKIP)]
    if len(lines) == 1 and failed and all(REFUSED in r.message for r in failed) and \
            not any(r.status == PASS for r in results if r.suite != "build"):
        return lines.pop()
    return None


def _plan(ctx: CheckContext, cfg: CheckConfig) -> tuple[list[SuiteInfo], list[CheckResult], list[tuple[int, Task]]]:
    """Every selected suite's plan: ready results (skips, config errors) and tasks, each
    with its position in the plan (results are sorted back into it)."""
    infos: list[SuiteInfo] = []
    ready: list[CheckResult] = []
    tasks: list[tuple[int, Task]] = []
    order = 0
    missing = {name: ctx.caps.lacking(getattr(SUITES[name], "requires", ())) for name in cfg.suites}
    ctx.suites_run = tuple(name for name in cfg.suites if not missing[name])
    for name in cfg.suites:
        suite = SUITES[name]
        infos.append(SuiteInfo(suite.name, suite.title, (suite.description or "").strip()))
        try:
            items = [lacks(name, name, missing[name], ctx.caps)] if missing[name] else suite.plan(ctx)
        except InputError:
            raise
        except Exception as e:  # a planning bug: fail closed
            items = [CheckResult(name, "plan", ERROR, f"could not plan the suite: {type(e).__name__}: {e}",
                                 details=traceback.format_exc())]
        together = getattr(suite, "together", "")
        for it in items:
            order += 1000
            it.unit = unit_key(name, it.name, together)
            if isinstance(it, CheckResult):
                it.order = order
                ready.append(it)
            else:
                tasks.append((order, it))
    return infos, ready, tasks


def _execute(tasks: list[tuple[int, Task]], jobs: int, emit: Callable[[CheckResult], None],
             spans: dict[str, list[float]], unit_seconds: dict[str, float], fail_fast: bool = False) -> None:
    """Run the tasks; spans[suite] = [first start, last end] (a suite's wall time, its tasks
    running in parallel with other suites'); unit_seconds[unit] += each task's own time.
    `fail_fast`: once a result fails (other than by the engine refusing the run), a task not
    yet started is its names' SKIPs instead."""
    lock = threading.Lock()
    first_failure: list[CheckResult] = []

    def timed(t: Task) -> list[CheckResult]:
        if first_failure:
            f = first_failure[0]
            return [CheckResult(t.suite, n, SKIP, f"not run: --fail-fast stopped the check at its first failure "
                                                  f"({f.suite} / {f.name})", {"skipped_by": "fail-fast"}, unit=t.unit)
                    for n in t.names or [t.name]]
        start = time.perf_counter()
        try:
            results = _run_task(t)
            for r in results:
                r.unit = t.unit
                # noted here, in the worker, so its next task already sees it;
                # a refusal does not stop it: whether the engine refuses every run decides exit 1
                # or 2 (engine_refuses_everything), and only the runs themselves can say
                if fail_fast and r.status in (FAIL, ERROR) and REFUSED not in r.message:
                    with lock:
                        first_failure[:] = first_failure or [r]
            return results
        finally:
            with lock:
                end = time.perf_counter()
                span = spans.setdefault(t.suite, [start, start])
                span[0], span[1] = min(span[0], start), max(span[1], end)
                unit_seconds[t.unit] = unit_seconds.get(t.unit, 0.0) + end - start

    def done(order: int, results: list[CheckResult]) -> None:
        for i, r in enumerate(results):
            r.order = order + i
            emit(r)

    # biggest first, so the long sequential tasks do not end up last
    ordered = sorted([ot for ot in tasks if not ot[1].exclusive], key=lambda ot: -ot[1].cost)
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="epmci-check") as pool:
        futs = {pool.submit(timed, t): (o, t) for o, t in ordered}
        for fut in as_completed(futs):
            o, t = futs[fut]
            done(o, fut.result())
    # exclusive tasks (timing) after all others, one at a time, in plan order
    for o, t in sorted((ot for ot in tasks if ot[1].exclusive), key=lambda ot: ot[0]):
        done(o, timed(t))


def _run_task(t: Task) -> list[CheckResult]:
    t0 = time.perf_counter()
    try:
        results = t.fn()
        if not results:
            raise RuntimeError("the task produced no result")
        return results
    except Exception as e:
        tb = traceback.format_exc()
        names = t.names or [t.name]
        return [CheckResult(t.suite, n, ERROR, f"internal error while checking: {type(e).__name__}: {e}",
                            {}, time.perf_counter() - t0, "", tb) for n in names]
