"""`epmci merge`: the shard reports of one check (`epmci check --shard K/N --json`) as one
verdict, one JUnit XML, one JSON report and one Markdown summary (check/merge.py). Exit 0
all passed, 1 a check failed, 2 the reports are not one whole check (every reason named)
or a file is not a shard report."""

from __future__ import annotations

import argparse
import sys

from .. import report as rep
from ..check.merge import merge, read_shard


def add_parser(sub) -> None:
    m = sub.add_parser("merge", help="one verdict from the reports of `epmci check --shard K/N`")
    m.add_argument("reports", nargs="+", metavar="REPORT.json", help="every shard's --json report")
    m.add_argument("--junit-xml", metavar="PATH", help="write the merged JUnit XML")
    m.add_argument("--json", metavar="PATH", help="write the merged report as JSON")
    m.add_argument("--markdown", metavar="PATH", help="write the Markdown summary")
    m.add_argument("-q", "--quiet", action="store_true", help="no console summary")
    m.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    report = merge([(path, read_shard(path)) for path in a.reports])
    if not a.quiet:
        print(rep.render_console(report), flush=True)
    rep.publish(report, a.junit_xml, a.json, a.markdown)
    if report.tool_error:
        print(f"epmci: error: {report.tool_error}", file=sys.stderr)
    return report.exit_code
