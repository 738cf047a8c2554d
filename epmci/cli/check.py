"""`epmci check`: the gate. Exit 0 all passed, 1 a check failed, 2 the tool could not run."""

from __future__ import annotations

import argparse
import contextlib
import sys

from .. import report as rep
from ..errors import InputError
from ..check.runner import run_check
from ..check.shard import Shard, read_durations
from .options import add_check_args, add_config_args, add_output_args, add_perf_args, config_from_args


def add_parser(sub) -> None:
    c = sub.add_parser("check", help="the correctness gate: every layer vs the NumPy reference")
    add_config_args(c)
    add_check_args(c)
    add_output_args(c)
    add_perf_args(c)
    c.add_argument("--shard", metavar="K/N", help="run only the K-th of N disjoint parts of the check, each a "
                   "machine's share; `epmci merge` makes one verdict of the N reports (perf goes to shard N)")
    c.add_argument("--durations", metavar="REPORT.json", help="with --shard: balance the shards by the seconds "
                   "each part took in this earlier report (default: estimated engine runs)")
    c.add_argument("--fail-fast", action="store_true", help="stop at the first failure: the checks not yet "
                   "started are SKIPs naming it (exit 1 as without it; for a quick answer, not for CI's record)")
    c.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    cfg = config_from_args(a)
    # `epmci contract-test` runs this too, without the shard options
    shard = Shard.parse(a.shard) if getattr(a, "shard", None) else None
    if getattr(a, "durations", None) and not shard:
        raise InputError("--durations", "balances shards: give --shard K/N too")
    durations = read_durations(a.durations) if shard and a.durations else None
    out = sys.stdout
    progress = None if a.quiet else rep.ConsoleProgress(out)
    print(f"epmci check: model {cfg.model}, engine {'bundled' if cfg.engine.cmd is None else cfg.engine.cmd}, "
          f"suites {','.join(cfg.suites)}{' (--fast)' if cfg.fast else ''}, config {cfg.source}", flush=True)
    with progress or contextlib.nullcontext():       # its heartbeat names the engine runs going on
        report = run_check(cfg, progress, build=not a.no_build, workdir=a.workdir, keep_work=a.keep_work,
                           note=progress.note if progress else None, shard=shard, durations=durations,
                           fail_fast=getattr(a, "fail_fast", False), keep_failed=a.keep_failed)
    print(file=out)
    print(rep.render_console(report), file=out, flush=True)
    rep.publish(report, a.junit_xml, a.json)
    removed = report.meta.get("workdirs_removed")
    if removed:
        print(f"removed the engine outputs of {len(removed)} older failed check(s) "
              f"(--keep-failed {report.meta['keep_failed']})", file=out)
    if report.meta.get("workdir_kept"):
        print(f"engine outputs kept in {report.meta['workdir']}", file=out)
    if report.tool_error:
        print(f"epmci: error: {report.tool_error}", file=sys.stderr)
    return report.exit_code
