"""The check as a JSON document (`format: epmci-check/1`, CheckReport.to_dict)."""

from __future__ import annotations

import json
import os

from ..check.result import CheckReport
from ..fsutil import atomic_write


def json_string(report: CheckReport) -> str:
    return json.dumps(report.to_dict(), indent=1, default=str) + "\n"


def write_json(report: CheckReport, path: str | os.PathLike) -> None:
    atomic_write(path, json_string(report))
