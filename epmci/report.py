"""Rendering of a CheckReport: console (progress + table), JUnit XML, JSON, Markdown.

Renderers read only CheckReport / CheckResult fields, never suite internals, so any suite
(correctness layers now, perf later) is rendered the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TextIO

import junit_xml

from .check.result import ERROR, FAIL, PASS, SKIP, CheckReport, CheckResult

STATUS_LABEL = {PASS: "PASS", FAIL: "FAIL", SKIP: "SKIP", ERROR: "ERROR"}
JUNIT_META = ("model", "engine", "config", "fast")
STATUS_ICON = {PASS: "✅", FAIL: "❌", SKIP: "⏭️", ERROR: "💥"}


def fmt_value(v) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1e5 or abs(v) < 1e-3:
            return f"{v:.3g}"
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    return str(v)


# --------------------------------------------------------------------- console

class ConsoleProgress:
    """One line per result as it comes in: `[ 3/17] kernel  L5 E63  PASS  2.1s  message`."""

    def __init__(self, stream: TextIO | None = None, total: int = 0):
        self.stream = stream or sys.stdout
        self.total = total
        self.done = 0

    def planned(self, total: int) -> None:
        self.total = total

    def note(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def __call__(self, r: CheckResult) -> None:
        self.done += 1
        w = len(str(self.total or self.done))
        msg = r.message if len(r.message) <= 110 else r.message[:107] + "..."
        print(f"[{self.done:>{w}}/{self.total or '?'}] {r.suite:<15} {r.name:<24} "
              f"{STATUS_LABEL[r.status]:<5} {r.seconds:6.1f}s  {msg}", file=self.stream, flush=True)


def render_console(report: CheckReport, width: int | None = None) -> str:
    width = width or max(100, shutil.get_terminal_size((120, 20)).columns)
    rows = [("SUITE", "CHECK", "STATUS", "TIME", "RESULT")]
    for suite, results in report.by_suite().items():
        for r in results:
            rows.append((suite, r.name, STATUS_LABEL[r.status], f"{r.seconds:.1f}s", r.message))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2, w3 = 6, max(len(r[3]) for r in rows)
    room = max(30, width - (w0 + w1 + w2 + w3 + 8))
    lines = []
    for i, (a, b, c, d, e) in enumerate(rows):
        e = e if len(e) <= room else e[:room - 3] + "..."
        lines.append(f"{a:<{w0}}  {b:<{w1}}  {c:<{w2}}  {d:>{w3}}  {e}")
        if i == 0:
            lines.append("-" * min(width, len(lines[0]) + 20))
    bad = [r for r in report.results if r.status in (FAIL, ERROR)]
    if bad:
        lines.append("")
        lines.append("Failures:")
        for r in sorted(bad, key=lambda r: (report.suite_names().index(r.suite), r.order)):
            lines.append(f"  {r.suite} / {r.name}: {STATUS_LABEL[r.status]}")
            lines.append(f"    {r.message}")
            if r.details:
                lines.extend("    " + l for l in r.details.splitlines())
            if r.stderr_tail:
                lines.append("    engine stderr (tail):")
                lines.extend("      " + l for l in r.stderr_tail.splitlines()[-10:])
    skipped = [r for r in report.results if r.status == SKIP]
    if skipped:
        lines.append("")
        for r in skipped:
            lines.append(f"Skipped {r.suite} / {r.name}: {r.message}")
    lines.append("")
    lines.append(summary_line(report))
    return "\n".join(lines)


def summary_line(report: CheckReport) -> str:
    c = report.counts()
    s = (f"epmci check: {report.verdict} -- {c[PASS]} passed, {c[FAIL]} failed, "
         f"{c[ERROR]} errors, {c[SKIP]} skipped in {report.seconds:.1f}s")
    if report.tool_error:
        s += f"\nepmci: error: {report.tool_error}"
    return s


# --------------------------------------------------------------------- JUnit

def _props_text(props: dict) -> dict[str, str]:
    return {k: json.dumps(v) if isinstance(v, (dict, list)) else fmt_value(v) if isinstance(v, float) else str(v)
            for k, v in props.items()}


def junit_string(report: CheckReport) -> str:
    """JUnit XML valid against the common (Jenkins junit-10) schema: one <testsuite> per
    suite; per-testcase numbers in the failure message and as testsuite properties named
    `<testcase>.<property>` (the schema allows no properties on a testcase)."""
    suites = []
    meta = {f"epmci.{k}": report.meta[k] for k in JUNIT_META if k in report.meta}
    ts = report.started
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))
    for name, results in report.by_suite().items():
        cases = []
        props = dict(_props_text(meta))
        for r in results:
            tc = junit_xml.TestCase(r.name, classname=f"epmci.{name}", elapsed_sec=max(r.seconds, 0.0),
                                    stderr=r.stderr_tail or None)
            out = "\n".join(x for x in (r.message, r.details) if x)
            if r.status == FAIL:
                tc.add_failure_info(message=r.message or "failed", output=out, failure_type="failure")
            elif r.status == ERROR:
                tc.add_error_info(message=r.message or "error", output=out, error_type="error")
            elif r.status == SKIP:
                tc.add_skipped_info(message=r.message or "skipped")
            for k, v in _props_text(r.properties).items():
                props[f"{r.name}.{k}"] = v
            props[f"{r.name}.status"] = r.status
            if r.status == PASS and r.message:
                tc.stdout = r.message
            cases.append(tc)
        suites.append(junit_xml.TestSuite(f"epmci.{name}", cases, timestamp=stamp,
                                          hostname=os.uname().nodename, properties=props))
    raw = junit_xml.to_xml_report_string(suites, prettyprint=False)
    root = ET.fromstring(raw)
    root.set("name", "epmci check")
    _normalize(root)
    root.set("time", f"{report.seconds:.3f}")   # wall time (suites ran in parallel)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _normalize(el: ET.Element) -> None:
    """Drop attributes the schema does not define (junit-xml writes `disabled`), and write
    every time as plain decimal seconds (never 1e-05)."""
    el.attrib.pop("disabled", None)
    if el.tag == "testcase":
        el.attrib.pop("status", None)
    if "time" in el.attrib:
        try:
            el.set("time", f"{float(el.get('time')):.3f}")
        except ValueError:
            el.attrib.pop("time")
    for c in el:
        _normalize(c)


def write_junit(report: CheckReport, path: str | os.PathLike) -> None:
    _write(path, junit_string(report))


# --------------------------------------------------------------------- JSON

def json_string(report: CheckReport) -> str:
    return json.dumps(report.to_dict(), indent=1, default=str) + "\n"


def write_json(report: CheckReport, path: str | os.PathLike) -> None:
    _write(path, json_string(report))


# --------------------------------------------------------------------- Markdown

def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def markdown(report: CheckReport) -> str:
    c = report.counts()
    icon = "✅" if report.exit_code == 0 else "❌"
    out = [f"## epmci check: {report.verdict} {icon}", ""]
    if report.tool_error:
        out += [f"**The check could not run:** {_md(report.tool_error)}", ""]
    out.append(f"{c[PASS]} passed, {c[FAIL]} failed, {c[ERROR]} errors, {c[SKIP]} skipped "
               f"in {report.seconds:.1f} s")
    m = report.meta
    facts = [f"{k}: `{m[k]}`" for k in ("model", "engine", "config") if k in m]
    if facts:
        out += ["", " · ".join(facts)]
    out.append("")
    out += ["| suite | check | status | time | result |", "|---|---|---|---:|---|"]
    for suite, results in report.by_suite().items():
        for r in results:
            out.append(f"| {suite} | {_md(r.name)} | {STATUS_ICON[r.status]} {STATUS_LABEL[r.status]} "
                       f"| {r.seconds:.1f} s | {_md(r.message)} |")
    skipped = [r for r in report.results if r.status == SKIP]
    if skipped:
        out.append("")
        for r in skipped:
            out.append(f"- **{r.suite} / {r.name} skipped:** {_md(r.message)}")
    bad = [r for r in report.results if r.status in (FAIL, ERROR)]
    for r in bad:
        out += ["", f"<details><summary>{STATUS_ICON[r.status]} {r.suite} / {r.name}: "
                    f"{_md(r.message)[:200]}</summary>", "", "```"]
        if r.details:
            out.append(r.details)
        if r.stderr_tail:
            out += ["engine stderr (tail):", r.stderr_tail]
        out += ["```", "", "</details>"]
    return "\n".join(out) + "\n"


def append_step_summary(report: CheckReport, env: dict | None = None) -> Path | None:
    """Append the Markdown summary to $GITHUB_STEP_SUMMARY when it is set."""
    path = (env if env is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown(report))
    return Path(path)


def _write(path: str | os.PathLike, text: str) -> None:
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
