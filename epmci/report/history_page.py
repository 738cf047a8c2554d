"""`epmci history check --html DIR`: a static page a reviewer reads -- one chart per metric
over the default branch's commits (every entry a point, E-Divisive's change points as
dashed lines, each segment's mean, the rebaseline), the verdicts, the pull request's
--perf-base ratio with its bounds, and links to the check's JUnit XML and summary.

The charts are matplotlib's SVG, inline in one HTML file (no script, no network): it opens
from an artifact as it is. Each point series carries an id (`points-<metric>`) so a browser
test can find it.
"""

from __future__ import annotations

import html
import io
import re
from pathlib import Path

from ..fsutil import atomic_write
from ..perf.history import MetricDrift

CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em}.fail{color:#b00;font-weight:bold}.ok{color:#070}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
figure{margin:0}svg{max-width:100%;height:auto}"""


def _slug(metric: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", metric.lower()).strip("-")


def chart_svg(d: MetricDrift) -> str:
    """One metric's chart as an SVG element."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(10, 3.2), dpi=100)
    ax = fig.add_subplot()
    x = list(range(len(d.values)))
    (points,) = ax.plot(x, d.values, marker="o", markersize=4, linewidth=1, color="#1f77b4", label="entries")
    points.set_gid(f"points-{_slug(d.metric)}")
    bounds = [d.start, *d.change_points, len(d.values)]
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            mean = sum(d.values[a:b]) / (b - a)
            ax.hlines(mean, a - 0.4, b - 0.6, colors="#888", linewidth=2)
    for i in d.change_points:
        ax.axvline(i - 0.5, color="#d62728", linestyle="--", linewidth=1.5,
                   gid=f"change-point-{_slug(d.metric)}-{i}")
    if d.start:
        ax.axvline(d.start - 0.5, color="#2ca02c", linestyle=":", linewidth=1.5, label="rebaseline")
    ax.set_xticks(x, [c[:7] for c in d.commits], rotation=90, fontsize=7)
    ax.set_ylabel(d.metric.split("/")[0].replace("_", " "))
    ax.set_title(d.metric, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def _pr_rows(pr: dict) -> list[str]:
    """Table rows of a pull request report's --perf-base tok/s verdicts."""
    rows = []
    for suite in pr.get("suites", []):
        for r in suite.get("results", []):
            p = r.get("properties") or {}
            if " vs base " in r.get("name", "") and "ratio" in p:
                rows.append(f"<tr><td>{html.escape(r['name'])}</td><td>{html.escape(str(r.get('status')))}</td>"
                            f"<td>x{p['ratio']:.4f}</td><td>[{p.get('ci_low', float('nan')):.4f}, "
                            f"{p.get('ci_high', float('nan')):.4f}]</td><td>{html.escape(str(p.get('verdict')))}</td></tr>")
    return rows


def render_page(entries: list[dict], verdicts: list[MetricDrift], pr: dict | None,
                links: list[tuple[str, str]]) -> str:
    failed = [d for d in verdicts if d.failed]
    head = entries[-1] if entries else {}
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>epmci perf history</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>epmci perf history: {html.escape(str(head.get('profile') or ''))} "
             f"{html.escape(str(head.get('model') or ''))}</h1>",
             f"<p id=verdict class={'fail' if failed else 'ok'}>"
             f"{'DRIFT in ' + ', '.join(html.escape(d.metric) for d in failed) if failed else 'no drift'}"
             f" &mdash; {len(entries)} entries, newest {html.escape(str(head.get('commit', ''))[:12])}</p>"]
    if links:
        parts.append("<p>" + " &middot; ".join(f"<a href=\"{html.escape(url, quote=True)}\">{html.escape(text)}</a>"
                                                 for text, url in links) + "</p>")
    if pr is not None:
        rows = _pr_rows(pr)
        parts.append("<h2>This pull request against its base (paced)</h2>")
        parts.append("<table id=pr><tr><th>result</th><th>status</th><th>head/base tok/s</th>"
                     "<th>bounds</th><th>verdict</th></tr>" + "".join(rows) + "</table>" if rows
                     else "<p id=pr>the report has no --perf-base verdict</p>")
    for d in verdicts:
        parts.append(f"<h2 id=\"{_slug(d.metric)}\">{html.escape(d.metric)}</h2>"
                     f"<p class={'fail' if d.failed else 'ok'}>{html.escape(d.message)}</p>"
                     f"<figure>{chart_svg(d)}</figure>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_page(directory: str, entries: list[dict], verdicts: list[MetricDrift], pr: dict | None,
               links: list[tuple[str, str]]) -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    return atomic_write(out / "index.html", render_page(entries, verdicts, pr, links))
