"""Logits of two runs (or of a run and a golden baseline) compared row by row: one
implementation for e2e, determinism and golden drift."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("exact", "argmax", "kl")


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@dataclass
class LogitsDiff:
    """a is the reference side (--no-pager, the first run, golden), b the side under test."""
    rows_a: int
    rows_b: int
    identical: bool            # same shape and the same bytes
    rows_differ: int
    first_row_differ: int | None
    max_abs: float
    argmax_agree: int          # rows whose argmax (first maximum) agrees
    max_kl: float              # max over rows of KL(softmax(a) || softmax(b)), nats
    mean_kl: float

    def props(self) -> dict:
        return {"rows": self.rows_a, "rows_other": self.rows_b, "identical": self.identical,
                "rows_differ": self.rows_differ, "max_abs_err": self.max_abs,
                "argmax_agree": self.argmax_agree, "max_kl": self.max_kl}

    def text(self) -> str:
        if self.rows_a != self.rows_b:
            return f"row counts differ ({self.rows_a} vs {self.rows_b})"
        if self.identical:
            return f"{self.rows_a} rows byte-identical"
        return (f"{self.rows_differ}/{self.rows_a} rows differ (first row {self.first_row_differ}), "
                f"max_abs_err {self.max_abs:.3g}, argmax agrees on {self.argmax_agree}/{self.rows_a}, "
                f"max KL {self.max_kl:.3g}")

    # the same numbers, worded for a drift from a golden baseline (a = golden)
    def drift_props(self) -> dict:
        return {"kl_max": self.max_kl, "kl_mean": self.mean_kl, "top1_agree": self.argmax_agree,
                "rows_compared": self.rows_a, "max_abs_diff": self.max_abs}

    def drift_text(self) -> str:
        if self.rows_a == 0:
            return "no logits rows to compare"
        where = "" if self.first_row_differ is None else f", first differing row {self.first_row_differ}"
        return (f"KL(golden||current) max {self.max_kl:.3g} mean {self.mean_kl:.3g} nats over {self.rows_a} "
                f"rows, top-1 agreement {self.argmax_agree}/{self.rows_a}, max |diff| {self.max_abs:.3g}{where}")


def compare_logits(a: np.ndarray, b: np.ndarray) -> LogitsDiff:
    inf = float("inf")
    if a.shape != b.shape:
        return LogitsDiff(a.shape[0], b.shape[0], False, max(a.shape[0], b.shape[0]), 0, inf, 0, inf, inf)
    identical = a.tobytes() == b.tobytes()
    neq = (a.view(np.uint32) != b.view(np.uint32)).any(axis=1) if a.size else np.zeros(0, bool)
    rows = np.nonzero(neq)[0]
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    max_abs = float(np.nanmax(d)) if d.size else 0.0
    agree = int((a.argmax(axis=1) == b.argmax(axis=1)).sum()) if a.size else 0
    if a.size:
        la, lb = log_softmax64(a), log_softmax64(b)
        kl = (np.exp(la) * (la - lb)).sum(axis=1)
        max_kl, mean_kl = float(kl.max()), float(kl.mean())
    else:
        max_kl = mean_kl = 0.0
    return LogitsDiff(a.shape[0], b.shape[0], identical, int(len(rows)),
                      int(rows[0]) if len(rows) else None, max_abs, agree, max_kl, mean_kl)


def drift(golden_rows: np.ndarray, current_rows: np.ndarray) -> LogitsDiff:
    """The rows both sides have, golden first; nothing comparable is an infinite drift."""
    n = min(len(golden_rows), len(current_rows))
    if n == 0 or golden_rows.shape[1:] != current_rows.shape[1:]:
        inf = float("inf")
        return LogitsDiff(0, 0, False, 0, 0, inf, 0, inf, inf)
    return compare_logits(np.asarray(golden_rows[:n]), np.asarray(current_rows[:n]))


def logits_verdict(diff: LogitsDiff, mode: str, max_kl: float) -> bool:
    """exact: byte-identical; argmax: every row's argmax agrees; kl: max KL <= max_kl."""
    if diff.rows_a != diff.rows_b or diff.rows_a == 0:
        return False
    if mode == "exact":
        return diff.identical
    if mode == "argmax":
        return diff.argmax_agree == diff.rows_a
    if mode == "kl":
        return bool(np.isfinite(diff.max_kl)) and diff.max_kl <= max_kl
    raise ValueError(mode)
