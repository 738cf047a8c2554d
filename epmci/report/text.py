"""What every renderer shares: status labels and icons, and how a number is printed."""

from __future__ import annotations

from collections import Counter

from ..check.result import ERROR, FAIL, PASS, SKIP, CheckReport

STATUS_LABEL = {PASS: "PASS", FAIL: "FAIL", SKIP: "SKIP", ERROR: "ERROR"}
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


def coverage(report: CheckReport) -> str:
    """Which suites ran and which did not, and why: a summary says truthfully what was
    checked. A suite ran when one of its results is not a skip; one whose results are all
    skips did not, for its first reason (e.g. "engine lacks pager")."""
    ran, skipped = [], []
    for suite, results in report.by_suite().items():
        if suite == "build" or not results:
            continue
        if any(r.status != SKIP for r in results):
            ran.append(suite)
        else:
            why = results[0].message
            skipped.append(f"{suite} ({why if len(why) <= 80 else why[:77] + '...'})")
    out = f"suites run: {', '.join(ran) or 'none'}"
    if skipped:
        out += f"; skipped: {'; '.join(skipped)}"
    if report.meta.get("suites_not_selected"):
        out += f"; not selected: {', '.join(report.meta['suites_not_selected'])}"
    return out


def headline(report: CheckReport) -> str:
    """The one line that matters: the first failing check and its reason, or how many
    passed and how many were skipped (and the commonest reason)."""
    if report.tool_error:
        return f"the check could not run: {report.tool_error}"
    bad = [r for r in report.results if r.status in (FAIL, ERROR)]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        return f"{bad[0].suite} / {bad[0].name}: {bad[0].message}{more}"
    c = report.counts()
    skipped = [r for r in report.results if r.status == SKIP]
    why = Counter(r.message for r in skipped).most_common(1)
    reason = f" ({why[0][0] if len(why[0][0]) <= 120 else why[0][0][:117] + '...'}" \
             f"{', ...' if len(set(r.message for r in skipped)) > 1 else ''})" if why else ""
    return f"{c[PASS]} checks passed, {c[SKIP]} skipped{reason}"


def skipped_summary(report: CheckReport, reasons: int = 3) -> str | None:
    """How many checks were skipped and why (the commonest reasons first): said at the top
    of a summary, because a skipped comparison is one the gate did not make."""
    skipped = [r for r in report.results if r.status == SKIP]
    if not skipped:
        return None
    why = Counter(r.message for r in skipped).most_common()
    parts = [f"{n} x {m if len(m) <= 160 else m[:157] + '...'}" for m, n in why[:reasons]]
    if len(why) > reasons:
        parts.append(f"{len(why) - reasons} other reason(s)")
    return f"{len(skipped)} check(s) skipped, not compared: " + "; ".join(parts)


def suite_times(report: CheckReport) -> str | None:
    """Each suite's wall time (its first task's start to its last one's end; suites overlap
    when runs go in parallel) and the whole check's, slowest first."""
    times = report.meta.get("suite_seconds") or {}
    if not times:
        return None
    parts = [f"{s} {t:.0f}s" for s, t in sorted(times.items(), key=lambda kv: -kv[1])]
    return f"wall time {report.seconds:.0f}s; per suite: " + ", ".join(parts)
