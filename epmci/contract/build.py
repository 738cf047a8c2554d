"""`epmci build`: get the engine ready to run, and time it.

Bundled engine: its numba kernels are compiled into numba's on-disk cache by engine runs
through every path a check uses (warm_up_runs: two sequences side by
side, so the checks that follow, running in parallel, do not all compile the same kernels
at once). Each warm-up run is an ordinary engine run, bounded by the engine run timeout.
External engine: engine.build_cmd is run, bounded by the build timeout.

A failed build is the tool not being able to run: the caller exits 2 with the stderr tail.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..gguf.file import EXPERT_PARTS, ModelFile
from .process import EngineCommand, EngineRun, run_engine
from .runspec import RunSpec, selftest_args

WARM_UP_BATCH = 2


@dataclass
class BuildResult:
    ok: bool
    name: str                  # what was built
    message: str               # one line
    props: dict = field(default_factory=dict)
    seconds: float = 0.0
    stderr_tail: str = ""
    details: str = ""
    refused: bool = False      # the engine refused to run (exit 2, its one line is in message)
    cannot_start: bool = False # the command could not be started (not found, not executable)

    @property
    def engine_failed(self) -> bool:
        """The engine itself broke: its build or a warm-up run crashed, timed out or exited
        non-zero -- a verdict on the engine (exit 1), not epmci unable to run (exit 2)."""
        return not self.ok and not self.refused and not self.cannot_start


def selftest_layers(model_path: str | Path) -> list[int]:
    """The first layer of every distinct expert quant-type mix."""
    mf = ModelFile(model_path)
    seen, out = set(), []
    for il in range(mf.hp.n_layer):
        types = tuple(mf.expert_range(il, 0, p).qtype for p in EXPERT_PARTS)
        if types not in seen:
            seen.add(types)
            out.append(il)
    return out


def warm_up_runs(model: str, workdir: str, arena_mb: float, layers: list[int]) -> list[list[list[str]]]:
    """Two sequences of engine runs that go through every path a check uses, run side by
    side: the resident forward then the paged forward with prefetch; and one selftest per
    layer in `layers` (the arena-slot specializations, writable arrays, compiled while the
    other sequence compiles the read-only ones)."""
    spec = RunSpec("a b c", n_predict=2, batch=WARM_UP_BATCH, ctx=64, threads=1, arena_mb=arena_mb)
    forward = [RunSpec("a b c", n_predict=2, batch=WARM_UP_BATCH, ctx=64, threads=1, pager=False).args(
                   model, Path(workdir) / "resident"),
               spec.args(model, Path(workdir) / "paged")]
    for d in ("resident", "paged"):
        (Path(workdir) / d).mkdir(parents=True, exist_ok=True)
    selftests = [selftest_args(model, [(il, 0, 2, Path(workdir) / f"st-{il}.bin")], threads=1, ctx=64,
                               batch=WARM_UP_BATCH, arena_mb=arena_mb) for il in layers]
    return [forward, selftests]


def build_engine(engine: EngineCommand, model_path: str | Path, arena_mb: float, *,
                 build_cmd: str | list[str] | None, build_timeout: float, run_timeout: float,
                 workdir: str | Path | None = None) -> BuildResult:
    t0 = time.perf_counter()
    if engine.bundled:
        name = "bundled engine (numba kernels)"
        with tempfile.TemporaryDirectory(prefix="epmci-build-", dir=workdir) as td:
            run, what = _warm_up(engine, str(model_path), td, arena_mb, run_timeout)
    elif build_cmd is None:
        return BuildResult(True, "external engine", "external engine: no engine.build_cmd configured, nothing to build",
                           {"kind": "external", "build_seconds": 0.0}, time.perf_counter() - t0)
    else:
        name, what = "external engine", "build"
        argv = shlex.split(build_cmd) if isinstance(build_cmd, str) else [str(x) for x in build_cmd]
        run = run_engine(EngineCommand(tuple(argv), False, engine.env), [], timeout=build_timeout, label="build")
    secs = time.perf_counter() - t0
    props = {"kind": "bundled" if engine.bundled else "external", "build_seconds": round(secs, 3),
             "command": run.command_line()}
    if run.ok:
        return BuildResult(True, name, f"built in {secs:.1f} s", props, secs,
                           details=f"command: {run.command_line()}")
    if run.launch_error:
        why = f"{what} command could not be started: {run.launch_error}"
    elif run.timed_out:
        why = f"{what} timed out after {run.timeout:g} s"
    else:
        why = f"{what} failed (exit {run.returncode})"
    last = [l for l in run.stderr.strip().splitlines() if l.strip()]
    if last:
        why += f": {last[-1].strip()[:300]}"
    return BuildResult(False, name, why, props, secs, run.stderr_tail(), f"command: {run.command_line()}",
                       refused=run.returncode == 2, cannot_start=bool(run.launch_error))


def _warm_up(engine: EngineCommand, model: str, workdir: str, arena_mb: float,
             timeout: float) -> tuple[EngineRun, str]:
    """Both warm-up sequences at once; the first failed run (and what it was), else the last run."""
    def sequence(runs: list[list[str]]) -> list[EngineRun]:
        done = []
        for args in runs:
            done.append(run_engine(engine, args, timeout=timeout, label="build warm-up"))
            if not done[-1].ok:
                break
        return done

    seqs = warm_up_runs(model, workdir, arena_mb, selftest_layers(model))
    with ThreadPoolExecutor(max_workers=len(seqs)) as pool:
        runs = [r for seq in pool.map(sequence, seqs) for r in seq]
    bad = next((r for r in runs if not r.ok), None)
    if bad is not None:
        mode = "selftest" if "--selftest" in bad.argv else "paged" if "--arena-mb" in bad.argv else "resident"
        return bad, f"warm-up run ({mode} path)"
    return runs[-1], "warm-up"
