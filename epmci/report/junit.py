"""JUnit XML of a check, written with ElementTree alone, as pytest's junitxml does.

Valid against the common Jenkins junit-10.xsd: one <testsuite> per suite; a testcase has no
properties in that schema, so each result's numbers go into the failure message and into
testsuite properties named `<testcase>.<property>`. Translates only: the verdict is the
CheckResult's status.
"""

from __future__ import annotations

import json
import os
import re
import time
import xml.etree.ElementTree as ET

from ..check.result import ERROR, FAIL, PASS, SKIP, CheckReport, CheckResult
from ..fsutil import atomic_write
from .text import fmt_value

JUNIT_META = ("model", "engine", "config", "fast")
# Characters XML 1.0 forbids or discourages (C0 controls but tab and newline, C1 controls,
# surrogates, non-characters): dropped, so any engine's stderr makes a parsable document.
_ILLEGAL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufdd0-\ufddf\ufffe\uffff"
                      "\U0001fffe-\U0001ffff\U0002fffe-\U0002ffff\U0003fffe-\U0003ffff\U0004fffe-\U0004ffff"
                      "\U0005fffe-\U0005ffff\U0006fffe-\U0006ffff\U0007fffe-\U0007ffff\U0008fffe-\U0008ffff"
                      "\U0009fffe-\U0009ffff\U000afffe-\U000affff\U000bfffe-\U000bffff\U000cfffe-\U000cffff"
                      "\U000dfffe-\U000dffff\U000efffe-\U000effff\U000ffffe-\U000fffff\U0010fffe-\U0010ffff]")


def _x(text: object) -> str:
    return _ILLEGAL.sub("", str(text))


def _secs(s: float) -> str:
    return f"{s:.3f}"


def _props_text(props: dict) -> dict[str, str]:
    return {k: json.dumps(v) if isinstance(v, (dict, list)) else fmt_value(v) if isinstance(v, float) else str(v)
            for k, v in props.items()}


def _testcase(parent: ET.Element, suite: str, r: CheckResult) -> None:
    attrs = {"name": _x(r.name)}
    if r.seconds > 0:
        attrs["time"] = _secs(r.seconds)
    attrs["classname"] = _x(f"epmci.{suite}")
    tc = ET.SubElement(parent, "testcase", attrs)
    out = "\n".join(x for x in (r.message, r.details) if x)
    if r.status in (FAIL, ERROR):
        tag = "failure" if r.status == FAIL else "error"
        el = ET.SubElement(tc, tag, {"type": tag, "message": _x(r.message or ("failed" if r.status == FAIL else "error"))})
        if out:
            el.text = _x(out)
    elif r.status == SKIP:
        ET.SubElement(tc, "skipped", {"type": "skipped", "message": _x(r.message or "skipped")})
    if r.status == PASS and r.message:
        ET.SubElement(tc, "system-out").text = _x(r.message)
    if r.stderr_tail:
        ET.SubElement(tc, "system-err").text = _x(r.stderr_tail)


def junit_string(report: CheckReport) -> str:
    meta = {f"epmci.{k}": report.meta[k] for k in JUNIT_META if k in report.meta}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(report.started))
    root = ET.Element("testsuites")
    totals = {"errors": 0, "failures": 0, "tests": 0}
    for name, results in report.by_suite().items():
        n = {s: sum(r.status == s for r in results) for s in (ERROR, FAIL, SKIP)}
        totals["errors"] += n[ERROR]
        totals["failures"] += n[FAIL]
        totals["tests"] += len(results)
        ts = ET.SubElement(root, "testsuite", {
            "errors": str(n[ERROR]), "failures": str(n[FAIL]), "name": _x(f"epmci.{name}"),
            "skipped": str(n[SKIP]), "tests": str(len(results)),
            "time": _secs(sum(max(r.seconds, 0.0) for r in results)),
            "hostname": _x(os.uname().nodename), "timestamp": stamp})
        props = dict(_props_text(meta))
        for r in results:
            for k, v in _props_text(r.properties).items():
                props[f"{r.name}.{k}"] = v
            props[f"{r.name}.status"] = r.status
        if props:
            pe = ET.SubElement(ts, "properties")
            for k, v in props.items():
                ET.SubElement(pe, "property", {"name": _x(k), "value": _x(v)})
        for r in results:
            _testcase(ts, name, r)
    if report.tool_error:        # the check could not run (exit 2): an error case, so JUnit readers fail too
        ts = ET.SubElement(root, "testsuite", {"errors": "1", "failures": "0", "name": "epmci", "skipped": "0",
                                               "tests": "1", "time": _secs(0.0), "hostname": _x(os.uname().nodename),
                                               "timestamp": stamp})
        _testcase(ts, "epmci", CheckResult("epmci", "the check could not run", ERROR, report.tool_error))
        totals["errors"] += 1
        totals["tests"] += 1
    for k, v in totals.items():
        root.set(k, str(v))
    root.set("time", _secs(report.seconds))     # wall time (suites ran in parallel)
    root.set("name", "epmci check")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(report: CheckReport, path: str | os.PathLike) -> None:
    atomic_write(path, junit_string(report))
