"""What every renderer shares: status labels and icons, and how a number is printed."""

from __future__ import annotations

from ..check.result import ERROR, FAIL, PASS, SKIP

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
