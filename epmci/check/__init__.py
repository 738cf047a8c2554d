"""`epmci check` as a library: run_check(config) -> CheckReport (see epmci.report to render)."""

from __future__ import annotations

from .result import CheckReport, CheckResult, SuiteInfo
from .runner import resolve_model, run_check

__all__ = ["CheckReport", "CheckResult", "SuiteInfo", "run_check", "resolve_model"]
