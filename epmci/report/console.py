"""The console rendering of a check: one progress line per result as it arrives, then the
table, the failures with their details and the summary line."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import TextIO

from ..check.result import ERROR, FAIL, PASS, SKIP, CheckReport, CheckResult
from ..contract.process import running
from .text import STATUS_LABEL, coverage, skipped_summary, suite_times


class ConsoleProgress:
    """One line per result as it comes in: `[ 3/17] kernel  L5 E63  PASS  2.1s  message`;
    and while nothing has been printed for `every` seconds, a line naming the engine runs
    still going (`... running: model (34 s), switches default (12 s)`), so a long step never
    looks like a hang. Use it as a context manager (the heartbeat thread stops on exit)."""

    def __init__(self, stream: TextIO | None = None, total: int = 0, every: float = 10.0):
        self.stream = stream or sys.stdout
        self.total = total
        self.done = 0
        self.every = every
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ConsoleProgress":
        self._thread = threading.Thread(target=self._heartbeat, name="epmci-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def planned(self, total: int) -> None:
        self.total = total

    def note(self, text: str) -> None:
        self._print(text)

    def __call__(self, r: CheckResult) -> None:
        self.done += 1
        w = len(str(self.total or self.done))
        msg = r.message if len(r.message) <= 110 else r.message[:107] + "..."
        self._print(f"[{self.done:>{w}}/{self.total or '?'}] {r.suite:<15} {r.name:<24} "
                    f"{STATUS_LABEL[r.status]:<5} {r.seconds:6.1f}s  {msg}")

    def _print(self, line: str) -> None:
        with self._lock:
            print(line, file=self.stream, flush=True)
            self._last = time.monotonic()

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(1.0, self.every)):
            if time.monotonic() - self._last < self.every:
                continue
            runs = running()
            if runs:
                shown = ", ".join(f"{label} ({secs:.0f} s)" for label, secs in runs[:4])
                self._print(f"    ... running: {shown}{f' and {len(runs) - 4} more' if len(runs) > 4 else ''}")


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
    lines = [coverage(report)]
    for note in (skipped_summary(report), suite_times(report)):
        if note:
            lines.append(note)
    lines.append("")
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
