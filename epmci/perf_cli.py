"""The `epmci golden ...` and `epmci bench` subcommands and the perf flags of `epmci check`
(hooked into epmci/cli.py's parser by add_parsers() and add_check_flags())."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .errors import InputError


# ------------------------------------------------------------------ parsers

def add_check_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--profile", help="runner profile of the golden baselines (golden/<profile>/; "
                                     "default: perf.profile of epmci.yaml)")
    c.add_argument("--no-timing", action="store_true",
                   help="skip every tok/s comparison (counters, fingerprints and RSS are still compared)")
    c.add_argument("--no-perf", action="store_true", help="do not run the perf suite")
    c.add_argument("--perf-base", metavar="REF",
                   help="also measure the engine of git REF against this one, interleaved (ABBA pairs)")


def perf_overrides(a: argparse.Namespace) -> dict:
    """Dotted config keys set by the perf flags (for cli._config_from_args)."""
    out = {}
    if getattr(a, "profile", None):
        out["perf.profile"] = a.profile
    if getattr(a, "no_timing", False):
        out["perf.timing"] = False
    if getattr(a, "perf_base", None):
        out["perf.base"] = a.perf_base
    return out


def apply_no_perf(cfg, a: argparse.Namespace):
    """--no-perf drops the perf suite; --perf-base needs it."""
    if getattr(a, "no_perf", False):
        cfg.suites = [s for s in cfg.suites if s != "perf"]
        if not cfg.suites:
            raise InputError("--no-perf", "no suite left to run")
    if cfg.perf.base and "perf" not in cfg.suites:
        raise InputError("--perf-base", "needs the perf suite (it is not in the suites run)")
    return cfg


def add_parsers(sub, add_config_args, config_from_args) -> None:
    g = sub.add_parser("golden", help="golden baselines per runner profile: update, show, diff")
    gsub = g.add_subparsers(dest="golden_command", required=True)

    up = gsub.add_parser("update", help="run the correctness checks, then measure and record the baselines "
                                        "of a profile (refused when a check fails)")
    add_config_args(up)
    up.add_argument("--profile", help="runner profile (default: perf.profile of epmci.yaml)")
    up.add_argument("--reason", required=True, help="why the baselines change (kept in the file)")
    up.add_argument("--no-timing", action="store_true", help="record counters and fingerprints only")
    up.add_argument("--repeat", type=int, help="timed runs per scenario (default: perf.repeats)")
    up.add_argument("--no-build", action="store_true", help="do not build the engine first")
    up.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    up.set_defaults(func=lambda a: cmd_update(a, config_from_args(a)))

    sh = gsub.add_parser("show", help="print a golden file")
    add_config_args(sh)
    sh.add_argument("--profile", help="runner profile (default: perf.profile of epmci.yaml)")
    sh.add_argument("path", nargs="?", help="a golden YAML file (default: the profile's file for --model)")
    sh.set_defaults(func=lambda a: cmd_show(a, config_from_args(a)))

    df = gsub.add_parser("diff", help="differences between two golden files (exit 1 when they differ)")
    add_config_args(df)
    df.add_argument("old", help="a golden YAML file, or a profile name (its file for --model)")
    df.add_argument("new", help="a golden YAML file, or a profile name (its file for --model)")
    df.set_defaults(func=lambda a: cmd_diff(a, config_from_args(a)))

    b = sub.add_parser("bench", help="the experiment matrix: KPIs and fingerprints per engine setting")
    add_config_args(b)
    from .bench import SUITES
    b.add_argument("--suite", default="quick", choices=[*SUITES, "all"])
    b.add_argument("--only", help="comma-separated substrings: run only experiments whose name has one")
    b.add_argument("--repeat", type=int, default=3, help="runs per experiment and prompt (median)")
    b.add_argument("--n-predict", type=int, help="generated tokens per run (default 32)")
    b.add_argument("--threads", type=int, help="engine compute threads (-t) of the baseline")
    b.add_argument("--out", default="results", help="directory for bench_<label>.json and .md")
    b.add_argument("--label", help="output file label (default: the suite)")
    b.set_defaults(func=lambda a: cmd_bench(a, config_from_args(a)))


# ------------------------------------------------------------------ golden

def _resolve(cfg, profile: str | None = None):
    from .check.runner import resolve_model
    from .golden import golden_path, golden_root, model_identity
    model = resolve_model(cfg.model)
    ident = model_identity(model)
    root = golden_root(cfg.perf.golden_dir, cfg.source)
    return model, ident, golden_path(root, profile or cfg.perf.profile, ident["id"])


def cmd_update(a: argparse.Namespace, cfg) -> int:
    import dataclasses

    from . import report as rep
    from .check import run_check
    from .check.context import CheckContext
    from .check.suites.perf import prepare, record_golden
    from .engine_runner import EngineCommand
    from .gguf.file import ModelFile
    from .golden import load, render, write
    if a.profile:
        cfg.perf.profile = a.profile
        from .perf_settings import validate_perf
        validate_perf(cfg.perf, "--profile")
    if not a.reason.strip():
        raise InputError("--reason", "a reason is required")
    repeats = a.repeat if a.repeat is not None else cfg.perf.repeats
    if repeats < 3 and not a.no_timing:
        raise InputError("--repeat", f"at least 3 timed runs are needed for a baseline, got {repeats}")
    out = sys.stdout
    say = (lambda s: None) if a.quiet else (lambda s: print(s, file=out, flush=True))
    checks = [s for s in cfg.suites if s != "perf"]
    if not checks:
        raise InputError("suites", "golden update needs at least one correctness suite to run first")
    ccfg = dataclasses.replace(cfg, suites=checks, fast=True)
    ccfg.source = cfg.source
    say(f"epmci golden update: profile {cfg.perf.profile}, model {cfg.model}; correctness first: "
        f"{', '.join(checks)} (--fast)")
    report = run_check(ccfg, None if a.quiet else rep.ConsoleProgress(out), build=not a.no_build, note=say)
    if report.tool_error:
        print(f"epmci: error: {report.tool_error}", file=sys.stderr)
        return 2
    if not report.passed:
        bad = [r for r in report.results if not r.ok]
        print(f"epmci golden update: refusing to record baselines: {len(bad)} correctness check(s) failed:",
              file=sys.stderr)
        for r in bad:
            print(f"  {r.suite} / {r.name}: {r.message}", file=sys.stderr)
        return 1
    say(f"correctness: {rep.summary_line(report)}")
    model = Path(report.meta["model"])
    with tempfile.TemporaryDirectory(prefix="epmci-golden-") as td:
        ctx = CheckContext(cfg, model, ModelFile(model), EngineCommand.from_setting(cfg.engine.cmd, cfg.engine.env),
                           Path(td))
        plan = prepare(ctx, load_golden=False)
        previous = None
        if plan.golden_file.exists():
            try:
                previous = load(plan.golden_file)
            except InputError as e:
                say(f"note: the existing {plan.golden_file} is unusable ({e.problem}); its history is lost")
        try:
            g = record_golden(ctx, plan, a.reason.strip(), timing=not a.no_timing, repeats=repeats,
                              previous=previous, say=say)
        except RuntimeError as e:
            print(f"epmci golden update: refusing to record baselines: {e}", file=sys.stderr)
            return 1
    path = write(g, plan.golden_file)
    print(render(g), file=out)
    print(f"epmci golden update: wrote {path} and {g.logits_file}", file=out)
    return 0


def cmd_show(a: argparse.Namespace, cfg) -> int:
    from .golden import load, render
    if a.path:
        path = Path(a.path)
    else:
        _, ident, path = _resolve(cfg, a.profile)
        if not path.exists():
            raise InputError(path, f"no golden baseline for profile {a.profile or cfg.perf.profile!r} and model "
                                   f"{ident['id']}")
    print(render(load(path)))
    return 0


def _side(cfg, spec: str):
    from .golden import load
    p = Path(spec)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        return load(p)
    _, ident, path = _resolve(cfg, spec)
    if not path.exists():
        raise InputError(path, f"no golden baseline for profile {spec!r} and model {ident['id']}")
    return load(path)


def cmd_diff(a: argparse.Namespace, cfg) -> int:
    from .golden import diff
    old, new = _side(cfg, a.old), _side(cfg, a.new)
    lines = diff(old, new)
    print(f"--- {old.path}\n+++ {new.path}")
    for line in lines:
        print(line)
    if not lines:
        print("(no differences)")
    return 1 if lines else 0


# ------------------------------------------------------------------ bench

def cmd_bench(a: argparse.Namespace, cfg) -> int:
    from .bench import main_bench
    if a.threads is not None:
        cfg.engine.threads = a.threads
    return main_bench(cfg, a.suite, a.only, a.repeat, a.out, a.label, a.n_predict)
