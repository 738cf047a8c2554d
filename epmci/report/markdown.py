"""The Markdown rendering of a check (the pull request's job summary)."""

from __future__ import annotations

import os
from pathlib import Path

from ..check.result import ERROR, FAIL, PASS, SKIP, CheckReport
from .text import STATUS_ICON, STATUS_LABEL, coverage, headline, skipped_summary, suite_times


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def markdown(report: CheckReport) -> str:
    c = report.counts()
    icon = "✅" if report.exit_code == 0 else "❌"
    line = headline(report)
    out = [f"## epmci check: {report.verdict} {icon} -- {_md(line if len(line) <= 160 else line[:157] + '...')}",
           "", f"**{_md(line)}**", ""]
    out.append(f"{c[PASS]} passed, {c[FAIL]} failed, {c[ERROR]} errors, {c[SKIP]} skipped "
               f"in {report.seconds:.1f} s")
    out += ["", _md(coverage(report))]
    note = skipped_summary(report)
    if note:
        out += ["", f"**{_md(note)}**"]
    times = suite_times(report)
    if times:
        out += ["", _md(times)]
    m = report.meta
    facts = [f"{k}: `{m[k]}`" for k in ("model", "engine", "config") if k in m]
    if facts:
        out += ["", " · ".join(facts)]
    for suite, results in report.by_suite().items():
        n = {st: sum(r.status == st for r in results) for st in STATUS_LABEL}
        tally = ", ".join(f"{k} {STATUS_LABEL[st].lower()}" for st, k in n.items() if k)
        out += ["", f"### {suite} ({tally})", "", "| check | status | time | result |", "|---|---|---:|---|"]
        for r in results:
            out.append(f"| {_md(r.name)} | {STATUS_ICON[r.status]} {STATUS_LABEL[r.status]} "
                       f"| {r.seconds:.1f} s | {_md(r.message)} |")
    plots = m.get("plots") or []
    if plots:
        out += ["", "Plots (next to the JUnit file, in the reports artifact): "
                + " · ".join(f"[{Path(p).name}]({Path(p).name})" for p in plots)]
    elif m.get("plots_note"):
        out += ["", f"_{_md(m['plots_note'])}_"]
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
