"""Recording golden baselines (`epmci golden update`): every scenario measured with the one
scenario loop (perf.run) and turned into a Golden. Nothing is written when a run fails or is
not reproducible."""

from __future__ import annotations

import platform
import statistics
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

from ..config.experiments import EXPERIMENTS
from ..contract.process import EngineCommand
from .golden import Golden, new_history, now, routing_sha256
from .plan import PerfPlan
from .measure import unstable
from .run import RunFailed, Scenario
from .speed import io_wait_share, machine_speed

# Share of the machine's CPU that other processes took during a timed run (perf.machine)
# above which the run is called out: its tok/s measured the neighbours as well.
BUSY_WARN_PCT = 20.0


def busy_note(pct: float | None) -> str:
    if pct is None or pct < BUSY_WARN_PCT:
        return ""
    return f" -- WARNING: other processes used {pct:.0f}% of the CPU meanwhile; this sample is low"


def record_golden(engine: EngineCommand, model: Path, plan: PerfPlan, workdir: Callable[[str], Path],
                  reason: str, *, timing: bool, repeats: int, timeout: float,
                  previous: Golden | None, say=lambda s: None) -> Golden:
    """Measure every scenario the way the check does and return the Golden to write. Raises
    RuntimeError when a run fails or is not reproducible (nothing is written then)."""
    scenarios, logits, routing = {}, {}, {}
    busiest: float | None = None    # the most CPU other processes took during a timed run
    for scen in plan.cfg.perf.scenarios:
        def progress(kind, i, n, m, scen=scen):
            if kind == "prompt":
                say(f"[golden] {scen} prompt {i + 1}/{n}: {m.tok_s:.2f} tok/s decode, logits {m.logits_sha256[:12]}")
            else:
                say(f"[golden] {scen} timed run {i + 1}/{n}: {m.tok_s:.2f} tok/s decode{busy_note(m.other_cpu_pct)}")

        sc = Scenario(engine, model, plan, scen, workdir, timeout=timeout, on_run=progress)
        try:
            runs = sc.run(repeats if timing else 1)
        except RunFailed as e:
            tail = e.measurement.run.stderr_tail() if e.measurement.run else ""
            raise RuntimeError(f"{scen}: {e.what} failed: {e.measurement.failure}" + (f"\n{tail}" if tail else ""))
        first, timed = runs.first, runs.timed
        bad = unstable(timed)
        if bad:
            raise RuntimeError(f"{scen}: timed run {bad[0]} is not reproducible (counters or logits differ "
                               f"from the first run): refusing to record")
        if runs.routing_failure:
            raise RuntimeError(f"{scen}: {runs.routing_failure}: refusing to record")
        routes = runs.routing or [None] * len(first)
        samples = [round(m.tok_s, 4) for m in timed]
        busy = [m.other_cpu_pct for m in timed if m.other_cpu_pct is not None]
        if timing and busy:
            busiest = max(busiest or 0.0, *busy)
        all_runs = first + timed[1:]
        exp = EXPERIMENTS[scen]
        scenarios[scen] = {
            "args": dict(exp.args),
            "env": dict(exp.env),
            "prefetch": sc.specs[0].prefetch,
            "arena_mb": sc.specs[0].arena_mb,
            "timing": ({"metric": "decode tok/s", "samples": samples,
                        "median": round(statistics.median(samples), 4),
                        "io_wait_share": io_wait_share([m.stats.get("decode", {}) for m in timed]),
                        "machine_speed": machine_speed(model)} if timing else None),
            "peak_rss_mb": max(m.peak_rss_mb for m in all_runs),
            "vm_swap_mb": max(m.vm_swap_mb for m in all_runs),
            "prompts": [{**m.fingerprint(), "counters": m.counters,
                         **({} if r is None else {"routing_sha256": routing_sha256(r)})} for m, r in zip(first, routes)],
        }
        for i, (m, r) in enumerate(zip(first, routes)):
            logits[f"{scen}/{i}"] = m.gen_rows
            if r is not None:
                routing[f"{scen}/{i}"] = r
    try:
        ver = version("epmci")
    except PackageNotFoundError:
        ver = "unknown"
    return Golden(
        profile=plan.profile,
        model=plan.model_id,
        engine=plan.engine,
        settings=plan.settings,
        scenarios=scenarios,
        machine=plan.machine,
        recorded={"date": now(), "reason": reason, "engine": engine.describe(), "epmci": ver,
                  "host": platform.node(), "timing": timing, "repeats": repeats if timing else 1,
                  **({"other_cpu_pct_max": busiest} if busiest is not None else {})},
        history=new_history(previous),
        logits=logits,
        routing=routing,
    )
