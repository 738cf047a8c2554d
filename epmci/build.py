"""`epmci build`: get the engine ready to run, and time it.

Bundled engine: its numba kernels are compiled into numba's on-disk cache by running the
engine in two subprocesses at once (`python -m epmci.build --warm MODE ...`) through every
path a check uses -- resident (--no-pager) then paged with prefetch, and --selftest (which
compiles the writable arena-slot specializations while the other compiles the read-only
ones) -- on the check's model, so every specialization the checks need is compiled before
the checks start (in parallel, they would otherwise all compile the same kernels at once).
External engine: engine.build_cmd is run.

A failed build is the tool not being able to run: exit 2 with the compiler's stderr tail.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .check.result import ERROR, PASS, CheckResult
from .config import CheckConfig
from .engine_runner import EngineCommand, EngineRun, run_engine

SUITE = "build"


def build_engine(cfg: CheckConfig, model_path: str | Path, arena_mb: float,
                 workdir: str | Path | None = None) -> CheckResult:
    t0 = time.perf_counter()
    engine = EngineCommand.from_setting(cfg.engine.cmd, cfg.engine.env)
    if engine.bundled:
        name = "bundled engine (numba kernels)"
        with tempfile.TemporaryDirectory(prefix="epmci-build-", dir=workdir) as td:
            run = _build_bundled(cfg, engine, str(model_path), td, arena_mb)
    elif cfg.engine.build_cmd is None:
        return CheckResult(SUITE, "external engine", PASS,
                           "external engine: no engine.build_cmd configured, nothing to build",
                           {"kind": "external", "build_seconds": 0.0}, time.perf_counter() - t0)
    else:
        name = "external engine"
        bc = cfg.engine.build_cmd
        argv = shlex.split(bc) if isinstance(bc, str) else [str(x) for x in bc]
        run = run_engine(EngineCommand(tuple(argv), False, engine.env), [],
                         timeout=cfg.engine.build_timeout_s, label="build")
    secs = time.perf_counter() - t0
    props = {"kind": "bundled" if engine.bundled else "external", "build_seconds": round(secs, 3),
             "command": run.command_line()}
    if run.ok:
        return CheckResult(SUITE, name, PASS, f"built in {secs:.1f} s", props, secs,
                           details=f"command: {run.command_line()}")
    if run.launch_error:
        why = f"build command could not be started: {run.launch_error}"
    elif run.timed_out:
        why = f"build timed out after {run.timeout:g} s"
    else:
        why = f"build failed (exit {run.returncode})"
    last = [l for l in run.stderr.strip().splitlines()
            if l.strip() and not l.startswith(("[epmci build]", "epmci build:"))]
    if last:
        why += f": {last[-1].strip()[:300]}"
    return CheckResult(SUITE, name, ERROR, why, props, secs, run.stderr_tail(),
                       f"command: {run.command_line()}")


# ------------------------------------------------------------------ warm-up subprocesses

def selftest_pairs(model_path: str) -> list[str]:
    """One `L:0` selftest per distinct expert quant-type mix: compiles the kernels on arena
    slots (writable arrays, a numba specialization of their own) without a forward pass."""
    from .gguf.file import EXPERT_PARTS, ModelFile
    mf = ModelFile(model_path)
    seen, out = set(), []
    for il in range(mf.hp.n_layer):
        types = tuple(mf.expert_range(il, 0, p).qtype for p in EXPERT_PARTS)
        if types not in seen:
            seen.add(types)
            out.append(f"{il}:0")
    return out


def _build_bundled(cfg: CheckConfig, engine: EngineCommand, model: str, workdir: str,
                   arena_mb: float) -> EngineRun:
    """Two warm-ups at once: the resident forward then the paged forward with prefetch; and
    selftests on arena slots. The selftests compile the kernels' writable-array
    specializations while the resident forward compiles the read-only ones, so by the time
    the paged forward needs the former they are in the cache. One EngineRun for both (the
    first failure wins)."""
    def warm(mode: str, extra: list[str]) -> EngineRun:
        cmd = EngineCommand((sys.executable, "-m", "epmci.build", "--warm", mode), False, engine.env)
        return run_engine(cmd, [model, workdir, f"{arena_mb:.6f}", *extra],
                          timeout=cfg.engine.build_timeout_s, label=f"build {mode}")

    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda a: warm(*a), [("forward", []),
                                                  ("selftest", [",".join(selftest_pairs(model))])]))
    bad = next((r for r in runs if not r.ok), None)
    r = bad or runs[-1]
    stderr = bad.stderr if bad else "\n".join(x.stderr for x in runs)
    return EngineRun("build", r.argv, r.env_extra, r.returncode, b"", stderr,
                     sum(x.seconds for x in runs), r.timeout, r.timed_out, r.launch_error)


def _warm(mode: str, model: str, workdir: str, arena_mb: str, pairs: str = "") -> int:
    """Run the bundled engine in-process through one path a check uses."""
    from engine.cli import main as engine_main
    common = ["-m", model, "-p", "a b c", "-n", "2", "-b", "2", "-c", "64", "-t", "1",
              "--no-chat", "--no-interactive"]
    if mode == "forward":
        steps = [common + ["--no-pager", "--dump-logits", "--logits-out", f"{workdir}/a.bin"],
                 common + ["--arena-mb", arena_mb, "--stats-file", f"{workdir}/s.jsonl"]]
    elif mode == "selftest":
        steps = [["-m", model, "-t", "1", "-b", "2", "--arena-mb", arena_mb,
                  "--selftest", f"{p}:2:{workdir}/st-{p.replace(':', '-')}.bin"] for p in pairs.split(",") if p]
    else:
        print(f"epmci build: unknown warm-up {mode!r}", file=sys.stderr)
        return 2
    for argv in steps:
        t0 = time.perf_counter()
        rc = engine_main(argv)
        what = "paged" if "--arena-mb" in argv and mode == "forward" else mode
        print(f"[epmci build] {what} {' '.join(argv[-2:])}: exit {rc} in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
        if rc != 0:
            print(f"epmci build: the engine's {what} path failed (exit {rc})", file=sys.stderr)
            return rc or 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) in (6, 7) and sys.argv[1] == "--warm":
        sys.exit(_warm(*sys.argv[2:]))
    print("usage: python -m epmci.build --warm forward|selftest MODEL WORKDIR ARENA_MB [L:E,...]",
          file=sys.stderr)
    sys.exit(2)
