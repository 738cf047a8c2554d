"""`epmci golden update|show|diff`: record, print and compare the baselines of a runner profile."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from .. import report as rep
from ..check.golden_update import update_golden
from ..config.schema import CheckConfig
from ..errors import InputError
from ..gguf.identity import model_identity
from ..perf.golden import Golden, diff, golden_path, golden_root, load, render
from ..synth.store import resolve_model
from .options import add_config_args, config_from_args


def add_parser(sub) -> None:
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
    up.set_defaults(func=update)

    sh = gsub.add_parser("show", help="print a golden file")
    add_config_args(sh)
    sh.add_argument("--profile", help="runner profile (default: perf.profile of epmci.yaml)")
    sh.add_argument("path", nargs="?", help="a golden YAML file (default: the profile's file for --model)")
    sh.set_defaults(func=show)

    df = gsub.add_parser("diff", help="differences between two golden files (exit 1 when they differ)")
    add_config_args(df)
    df.add_argument("old", help="a golden YAML file, or a profile name (its file for --model)")
    df.add_argument("new", help="a golden YAML file, or a profile name (its file for --model)")
    df.set_defaults(func=compare)


def update(a: argparse.Namespace) -> int:
    cfg = config_from_args(a)
    if not a.reason.strip():
        raise InputError("--reason", "a reason is required")
    repeats = a.repeat if a.repeat is not None else cfg.perf.repeats
    if repeats < 3 and not a.no_timing:
        raise InputError("--repeat", f"at least 3 timed runs are needed for a baseline, got {repeats}")
    out = sys.stdout
    say = (lambda s: None) if a.quiet else (lambda s: print(s, file=out, flush=True))
    progress = None if a.quiet else rep.ConsoleProgress(out)
    with progress or contextlib.nullcontext():
        u = update_golden(cfg, a.reason.strip(), timing=not a.no_timing, repeats=repeats, build=not a.no_build,
                          progress=progress, say=say)
    if u.report.tool_error:
        print(f"epmci: error: {u.report.tool_error}", file=sys.stderr)
        return 2
    if not u.report.passed:
        print(f"epmci golden update: refusing to record baselines: {len(u.failed_checks)} correctness "
              f"check(s) failed:", file=sys.stderr)
        for r in u.failed_checks:
            print(f"  {r.suite} / {r.name}: {r.message}", file=sys.stderr)
        return 1
    say(f"correctness: {rep.summary_line(u.report)}")
    if u.golden is None:
        print(f"epmci golden update: refusing to record baselines: {u.refused}", file=sys.stderr)
        return 1
    print(render(u.golden), file=out)
    print(f"epmci golden update: wrote {u.path} and {u.golden.logits_file}", file=out)
    return 0


def _profile_file(cfg: CheckConfig, profile: str) -> Path:
    model = resolve_model(cfg.model)
    ident = model_identity(model)
    path = golden_path(golden_root(cfg.perf.golden_dir, cfg.source), profile, ident["id"])
    if not path.exists():
        raise InputError(path, f"no golden baseline for profile {profile!r} and model {ident['id']}")
    return path


def show(a: argparse.Namespace) -> int:
    cfg = config_from_args(a)
    print(render(load(Path(a.path) if a.path else _profile_file(cfg, cfg.perf.profile))))
    return 0


def _side(cfg: CheckConfig, spec: str) -> Golden:
    p = Path(spec)
    return load(p if p.suffix in (".yaml", ".yml") or p.is_file() else _profile_file(cfg, spec))


def compare(a: argparse.Namespace) -> int:
    cfg = config_from_args(a)
    old, new = _side(cfg, a.old), _side(cfg, a.new)
    lines = diff(old, new)
    print(f"--- {old.path}\n+++ {new.path}")
    for line in lines:
        print(line)
    if not lines:
        print("(no differences)")
    return 1 if lines else 0
