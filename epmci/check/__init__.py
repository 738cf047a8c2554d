"""`epmci check`: the result model, the context every suite gets, the runner and the suites."""

from .result import CheckReport, CheckResult, SuiteInfo
from .runner import run_check

__all__ = ["CheckReport", "CheckResult", "SuiteInfo", "run_check"]
