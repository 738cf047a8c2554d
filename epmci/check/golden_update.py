"""`epmci golden update` as a library call: the correctness suites first (as --fast), and only
when every one passed, every perf scenario measured and recorded (perf.record) into the
profile's golden file, written atomically, with the identity of the engine measured (a file
holding another engine's baselines is not replaced)."""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config.schema import CheckConfig
from ..contract.process import EngineCommand
from ..errors import InputError
from ..gguf.facts import ModelFacts
from ..gguf.file import ModelFile
from ..perf.golden import Golden, load, write
from ..perf.plan import prepare
from ..perf.record import record_golden
from ..perf.settings import for_model
from .capabilities import declared
from .result import CheckReport, CheckResult
from .runner import run_check


@dataclass
class Update:
    report: CheckReport                  # the correctness run
    golden: Golden | None = None         # what was written, when it was
    path: Path | None = None
    refused: str | None = None           # why nothing was recorded

    @property
    def failed_checks(self) -> list[CheckResult]:
        return [r for r in self.report.results if not r.ok]


def update_golden(cfg: CheckConfig, reason: str, *, timing: bool, repeats: int, build: bool = True,
                  progress: Callable[[CheckResult], None] | None = None,
                  say: Callable[[str], None] = lambda s: None) -> Update:
    checks = [s for s in cfg.suites if s != "perf"]
    if not checks:
        raise InputError("suites", "golden update needs at least one correctness suite to run first")
    ccfg = dataclasses.replace(cfg, suites=checks, fast=True)
    ccfg.source = cfg.source
    say(f"epmci golden update: profile {cfg.perf.profile}, model {cfg.model}; correctness first: "
        f"{', '.join(checks)} (--fast)")
    report = run_check(ccfg, progress, build=build, note=say)
    out = Update(report)
    if report.tool_error or not report.passed:
        out.refused = report.tool_error or f"{len(out.failed_checks)} correctness check(s) failed"
        return out
    model = Path(report.meta["model"])
    mf = ModelFile(model)
    cfg, _ = for_model(cfg, mf)          # the settings the check just ran with
    engine = EngineCommand.of_settings(cfg.engine)
    caps, why = declared(cfg, engine)
    if caps is None:
        out.refused = why
        return out
    engine = engine.with_features(caps.features)
    plan = prepare(cfg, model, ModelFacts.of(mf, cfg.run.slot_align, cfg.run.slot_windows), caps.identity(engine),
                   load_golden=False)
    previous = None
    if plan.golden_file.exists():
        try:
            previous = load(plan.golden_file)
        except InputError as e:
            say(f"note: the existing {plan.golden_file} is unusable ({e.problem}); its history is lost")
    if previous is not None and previous.foreign(plan.engine):
        out.refused = (f"{previous.foreign(plan.engine)}; record this engine's baselines under another "
                       f"--profile rather than replace them")
        return out
    with tempfile.TemporaryDirectory(prefix="epmci-golden-") as td:
        def workdir(name: str) -> Path:
            p = Path(td) / name
            p.mkdir(parents=True, exist_ok=True)
            return p
        try:
            g = record_golden(engine, model, plan, workdir, reason, timing=timing, repeats=repeats,
                              timeout=cfg.engine.timeout_s, previous=previous, say=say)
        except RuntimeError as e:
            out.refused = str(e)
            return out
    out.golden, out.path = g, write(g, plan.golden_file)
    return out
