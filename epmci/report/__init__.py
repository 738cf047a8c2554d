"""Renderings of a CheckReport: console, JUnit XML, JSON, Markdown. Renderers read only
CheckReport / CheckResult fields, never suite internals, so every suite renders the same way."""

from .console import ConsoleProgress, render_console, summary_line
from .data import json_string, write_json
from .junit import junit_string, write_junit
from .markdown import append_step_summary, markdown
from .plots import write_plots
from .publish import publish
from .text import fmt_value

__all__ = ["ConsoleProgress", "append_step_summary", "fmt_value", "json_string", "junit_string", "markdown", "publish", "write_plots",
           "render_console", "summary_line", "write_json", "write_junit"]
