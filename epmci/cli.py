"""The `epmci` command: a thin shell over the library. Exit 0 ok, 1 check failed, 2 could not run."""

from __future__ import annotations

import argparse
import json
import sys

from .errors import InputError
from .synth.presets import PRESETS


def _cmd_model_make(a: argparse.Namespace) -> int:
    from .synth.store import make_model
    path = make_model(a.preset, a.seed, a.out)
    print(path)
    return 0


def _cmd_model_info(a: argparse.Namespace) -> int:
    from .gguf.file import ModelFile
    from .gguf.info import model_summary, render_summary
    s = model_summary(ModelFile(a.path))
    print(json.dumps(s, indent=1) if a.json else render_summary(s))
    return 0


def _config_from_args(a: argparse.Namespace):
    """epmci.yaml (or --config) <- --set KEY=VALUE <- the dedicated flags."""
    from .config import load_config, parse_set, set_path
    from .perf_cli import apply_no_perf, perf_overrides
    over = parse_set(a.set)
    flags = {
        "model": a.model, "engine.cmd": a.engine_cmd, "engine.build_cmd": a.build_cmd,
        "engine.timeout_s": getattr(a, "timeout", None), "engine.threads": getattr(a, "threads", None),
        "run.jobs": getattr(a, "jobs", None), "run.arena_mb": getattr(a, "arena_mb", None),
    }
    if getattr(a, "fast", False):
        flags["fast"] = True
    if getattr(a, "suites", None):
        flags["suites"] = [x.strip() for x in a.suites.split(",") if x.strip()]
    if getattr(a, "layers", None):
        try:
            flags["layer.layers"] = [int(x) for x in a.layers.split(",") if x.strip()]
        except ValueError:
            raise InputError("--layers", f"expected comma-separated layer numbers, got {a.layers!r}") from None
    flags.update(perf_overrides(a))
    for k, v in flags.items():
        if v is not None:
            set_path(over, k, v)
    return apply_no_perf(load_config(a.config, over), a)


def _cmd_build(a: argparse.Namespace) -> int:
    from .build import build_engine
    from .check.context import CheckContext
    from .check.runner import resolve_model
    from .engine_runner import EngineCommand
    from .gguf.file import ModelFile
    cfg = _config_from_args(a)
    model = resolve_model(cfg.model)
    ctx = CheckContext(cfg, model, ModelFile(model), EngineCommand.from_setting(cfg.engine.cmd), model.parent)
    print(f"epmci build: {ctx.engine.describe()} on {model}", flush=True)
    r = build_engine(cfg, model, ctx.auto_arena_mb(2))
    if r.status != "pass":
        print(f"epmci: error: engine build failed: {r.message}", file=sys.stderr)
        if r.stderr_tail:
            print(r.stderr_tail, file=sys.stderr)
        return 2
    print(f"epmci build: {r.message}")
    return 0


def _cmd_check(a: argparse.Namespace) -> int:
    from . import report as rep
    from .check import run_check
    cfg = _config_from_args(a)
    out = sys.stdout
    progress = None if a.quiet else rep.ConsoleProgress(out)
    print(f"epmci check: model {cfg.model}, engine {'bundled' if cfg.engine.cmd is None else cfg.engine.cmd}, "
          f"suites {','.join(cfg.suites)}{' (--fast)' if cfg.fast else ''}, config {cfg.source}", flush=True)
    report = run_check(cfg, progress, build=not a.no_build, workdir=a.workdir, keep_work=a.keep_work,
                       note=None if a.quiet else (lambda s: print(s, flush=True)))
    print(file=out)
    print(rep.render_console(report), file=out, flush=True)
    if a.junit_xml:
        rep.write_junit(report, a.junit_xml)
    if a.json:
        rep.write_json(report, a.json)
    rep.append_step_summary(report)
    if report.meta.get("workdir_kept"):
        print(f"engine outputs kept in {report.meta['workdir']}", file=out)
    if report.tool_error:
        print(f"epmci: error: {report.tool_error}", file=sys.stderr)
    return report.exit_code


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="settings file (default: epmci.yaml in the cwd or a parent)")
    p.add_argument("--model", help="preset name (made on first use) or path to a qwen3moe GGUF")
    p.add_argument("--engine-cmd", help="engine command line speaking docs/engine-contract.md "
                                        "(default: the bundled engine)")
    p.add_argument("--build-cmd", help="external engine: its build command")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any setting, e.g. --set layer.tolerance.atol=1e-6 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="epmci", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="make or inspect synthetic qwen3moe GGUF models")
    msub = model.add_subparsers(dest="model_command", required=True)
    mk = msub.add_parser("make", help="write a preset model (cached unless --out)")
    mk.add_argument("--preset", required=True, help=" | ".join(PRESETS))
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--out", default=None, help="write here instead of the cache")
    mk.set_defaults(func=_cmd_model_make)
    info = msub.add_parser("info", help="print a model's dimensions and expert layout")
    info.add_argument("path")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=_cmd_model_info)

    b = sub.add_parser("build", help="compile the engine (numba cache) or run its build command; "
                                     "exit 2 on failure")
    _add_config_args(b)
    b.set_defaults(func=_cmd_build)

    c = sub.add_parser("check", help="the correctness gate: every layer vs the NumPy reference")
    _add_config_args(c)
    c.add_argument("--fast", action="store_true", help="skip the end-to-end A/B suite")
    c.add_argument("--suites", help="comma-separated suites to run "
                                    "(kernel,layer,prefetch-stress,determinism,e2e,perf)")
    c.add_argument("--layers", help="comma-separated layers for the layer / prefetch-stress suites")
    c.add_argument("--jobs", type=int, help="engine runs at once (0 = one per CPU)")
    c.add_argument("--threads", type=int, help="engine compute threads (-t)")
    c.add_argument("--timeout", type=float, help="seconds before an engine run is killed")
    c.add_argument("--arena-mb", type=float, help="arena of the ordinary paged runs")
    c.add_argument("--junit-xml", metavar="PATH", help="write JUnit XML")
    c.add_argument("--json", metavar="PATH", help="write the report as JSON")
    c.add_argument("--no-build", action="store_true", help="do not build the engine first")
    c.add_argument("--workdir", help="where engine outputs go (default: a temp dir)")
    c.add_argument("--keep-work", action="store_true", help="keep engine outputs even when all passed")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    from .perf_cli import add_check_flags, add_parsers
    add_check_flags(c)
    c.set_defaults(func=_cmd_check)
    add_parsers(sub, _add_config_args, _config_from_args)   # golden update|show|diff, bench
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as e:
        print(f"epmci: error: {e.where}: {e.problem}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
