"""`epmci history append|check`: the perf history of the default branch, and the drift that
no single pull request shows (epmci/perf/history.py). Exit 0 no drift, 1 a metric drifted,
2 bad input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import InputError
from ..fsutil import atomic_write, read_json
from ..perf.machine import current_commit
from ..perf.history import DriftRule, append, drift, entry_of_report, read_history
from ..config import load_config, parse_set


def add_parser(sub) -> None:
    h = sub.add_parser("history", help="perf history of the default branch: append a check's measurements, "
                                       "find drift with change-point detection")
    hsub = h.add_subparsers(dest="history_command", required=True)

    ap = hsub.add_parser("append", help="add a check report's tok/s and peak RSS to a history file")
    ap.add_argument("report", help="the JSON report of an `epmci check` that timed its perf runs (--json)")
    ap.add_argument("--history", required=True, metavar="FILE", help="the history (JSON lines; made if missing)")
    ap.add_argument("--commit", help="the commit measured (default: $GITHUB_SHA, else git rev-parse HEAD)")
    ap.add_argument("--rebaseline", action="store_true",
                    help="golden was re-recorded here: drift is measured from this entry on")
    ap.set_defaults(func=run_append)

    ck = hsub.add_parser("check", help="change points and drift of every metric (exit 1 on drift)")
    ck.add_argument("--config", help="settings file (default: epmci.yaml in the cwd or a parent): perf.drift_*")
    ck.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    ck.add_argument("--history", required=True, metavar="FILE", help="the history (JSON lines)")
    ck.add_argument("--json", metavar="PATH", help="write every metric's series, change points and verdict")
    ck.add_argument("--html", metavar="DIR", help="write a page with a chart per metric (DIR/index.html)")
    ck.add_argument("--pr-report", metavar="PATH",
                    help="with --html: a pull request's check report; its --perf-base ratio is shown with its bounds")
    ck.add_argument("--link", action="append", default=[], metavar="TEXT=URL",
                    help="with --html: a link on the page (the JUnit XML, the summary; repeatable)")
    ck.set_defaults(func=run_check)


def _commit(given: str | None) -> str:
    commit = given or current_commit()
    if not commit:
        raise InputError("--commit", "not given, no $GITHUB_SHA and no git commit here")
    return commit


def run_append(a: argparse.Namespace) -> int:
    report = read_json(a.report, "check report")
    try:
        entry = entry_of_report(report, _commit(a.commit), rebaseline=a.rebaseline)
    except InputError as e:
        raise InputError(a.report, e.problem) from None
    append(a.history, entry)
    print(f"epmci history: {a.history}: + {entry['commit'][:12]} ({len(entry['metrics'])} metrics"
          f"{', rebaseline' if a.rebaseline else ''})")
    return 0


def run_check(a: argparse.Namespace) -> int:
    cfg = load_config(a.config, parse_set(a.set))
    if not Path(a.history).exists():
        raise InputError(a.history, "no such history (epmci history append makes one)")
    entries = read_history(a.history)
    if not entries:
        raise InputError(a.history, "the history has no entries")
    verdicts = drift(entries, DriftRule.of(cfg.perf))
    for d in verdicts:
        print(("DRIFT " if d.failed else "ok    ") + d.message)
    for d in verdicts:
        if d.proposal:
            print("PROPOSE re-baseline: " + d.proposal)
    if a.json:
        atomic_write(a.json, json.dumps({"history": str(a.history), "entries": len(entries),
                                         "metrics": [d.to_dict() for d in verdicts]}, indent=1) + "\n")
    if a.html:
        from ..report.history_page import write_page
        links = []
        for item in a.link:
            text, sep, url = item.partition("=")
            if not sep or not text or not url:
                raise InputError("--link", f"expected TEXT=URL, got {item!r}")
            links.append((text, url))
        pr = read_json(a.pr_report, "pull request's report") if a.pr_report else None
        print(f"epmci history: wrote {write_page(a.html, entries, verdicts, pr, links)}")
    failed = [d for d in verdicts if d.failed]
    return 1 if failed else 0
