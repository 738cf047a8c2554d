"""A finished report written where the user asked: pictures beside the reports (linked
from the summary), JUnit XML, JSON, a Markdown file and the workflow's step summary. One
place, so `epmci check` and `epmci merge` publish the same way."""

from __future__ import annotations

import os
from pathlib import Path

from ..check.result import CheckReport
from ..fsutil import atomic_write
from .data import write_json
from .junit import write_junit
from .markdown import append_step_summary, markdown
from .plots import write_plots


def publish(report: CheckReport, junit_xml: str | os.PathLike | None = None, json: str | os.PathLike | None = None,
            markdown_path: str | os.PathLike | None = None) -> None:
    reports_dir = next((Path(f).parent for f in (junit_xml, json, markdown_path) if f), None)
    if reports_dir is not None:
        plots, note = write_plots(report, reports_dir)
        report.meta["plots"] = [str(p) for p in plots]
        if note:
            report.meta["plots_note"] = note
    if junit_xml:
        write_junit(report, junit_xml)
    if json:
        write_json(report, json)
    if markdown_path:
        atomic_write(markdown_path, markdown(report))
    append_step_summary(report)
