"""`epmci build`: compile the engine (the bundled engine's numba cache) or run its build command."""

from __future__ import annotations

import argparse
import sys

from ..check.runner import build_for_check, engine_at_fault
from ..contract.process import EngineCommand
from ..gguf.facts import ModelFacts
from ..gguf.file import ModelFile
from ..perf.settings import for_model
from ..synth.store import resolve_model
from .options import add_config_args, config_from_args


def add_parser(sub) -> None:
    b = sub.add_parser("build", help="compile the engine (numba cache) or run its build command; "
                                     "exit 1 when the engine fails to build or start, 2 when it cannot be run")
    add_config_args(b)
    b.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    cfg = config_from_args(a)
    model = resolve_model(cfg.model)
    engine = EngineCommand.of_settings(cfg.engine)
    mf = ModelFile(model)
    cfg, _ = for_model(cfg, mf)
    facts = ModelFacts.of(mf, cfg.run.slot_align, cfg.run.slot_windows)
    print(f"epmci build: {engine.describe()} on {model}", flush=True)
    r = build_for_check(cfg, engine, model, facts)
    if not r.ok:
        print(f"epmci: error: engine build failed: {r.message}", file=sys.stderr)
        if r.stderr_tail and not r.refused:        # a refusal is its one line; a compiler's tail helps
            print(r.stderr_tail, file=sys.stderr)
        return 1 if engine_at_fault(r, cfg, engine, mf) else 2
    print(f"epmci build: {r.message}")
    return 0
