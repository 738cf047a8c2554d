"""`epmci check`: the gate. Exit 0 all passed, 1 a check failed, 2 the tool could not run."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from .. import report as rep
from ..check.runner import run_check
from .options import add_check_args, add_config_args, add_output_args, add_perf_args, config_from_args


def add_parser(sub) -> None:
    c = sub.add_parser("check", help="the correctness gate: every layer vs the NumPy reference")
    add_config_args(c)
    add_check_args(c)
    add_output_args(c)
    add_perf_args(c)
    c.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    cfg = config_from_args(a)
    out = sys.stdout
    progress = None if a.quiet else rep.ConsoleProgress(out)
    print(f"epmci check: model {cfg.model}, engine {'bundled' if cfg.engine.cmd is None else cfg.engine.cmd}, "
          f"suites {','.join(cfg.suites)}{' (--fast)' if cfg.fast else ''}, config {cfg.source}", flush=True)
    with progress or contextlib.nullcontext():       # its heartbeat names the engine runs going on
        report = run_check(cfg, progress, build=not a.no_build, workdir=a.workdir, keep_work=a.keep_work,
                           note=progress.note if progress else None)
    print(file=out)
    print(rep.render_console(report), file=out, flush=True)
    reports_dir = next((Path(f).parent for f in (a.junit_xml, a.json) if f), None)
    if reports_dir is not None:                 # pictures next to the reports, linked from the summary
        plots, note = rep.write_plots(report, reports_dir)
        report.meta["plots"] = [str(p) for p in plots]
        if note:
            report.meta["plots_note"] = note
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
