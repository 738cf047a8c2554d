"""Logits of two runs (or of a run and a reference, or a golden baseline) compared row by
row: the one comparison behind the model, contract, e2e, switches and determinism suites,
golden drift and `epmci compare`.

`compare_logits` keeps every row's numbers (bytes equal, argmax of each side, KL, max
|diff|, a's own top-1 margin), so a caller asks for the first failing row or a summary
from the same arrays instead of comparing again. A `LogitsRule` is the verdict: exact
(byte-identical), argmax (every row's first maximum agrees) or kl (every row's KL(a || b) at
most max_kl nats). Under kl an argmax may flip only at a near tie: by Pinsker's inequality
KL <= k moves no probability by more than sqrt(k / 2), so a flip needs a's top two within
2 sqrt(k / 2) of each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("exact", "argmax", "kl")


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@dataclass(frozen=True)
class LogitsRule:
    """How two sides' logits must agree for a pass."""
    mode: str                  # exact | argmax | kl
    max_kl: float = 0.0        # nats, at every row (kl)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"logits compare mode {self.mode!r} is not one of {', '.join(MODES)}")

    def text(self) -> str:
        return f"kl <= {self.max_kl:g}" if self.mode == "kl" else self.mode


EXACT = LogitsRule("exact")


@dataclass(frozen=True)
class LogitsDiff:
    """a is the reference side (the reference, --no-pager, the first run, golden), b the side
    under test. Per-row arrays cover the rows both have; a shape mismatch leaves them empty."""
    rows_a: int
    rows_b: int
    differ: np.ndarray         # per row: the bytes differ
    top1_a: np.ndarray         # per row: first maximum of a
    top1_b: np.ndarray
    kl: np.ndarray             # per row: KL(softmax(a) || softmax(b)), nats
    abs_diff: np.ndarray       # per row: max |a - b|
    margin_a: np.ndarray       # per row: a's top-1 logit minus its second
    same_shape: bool = True

    # -------------------------------------------------------------- summaries

    @property
    def comparable(self) -> bool:
        return self.same_shape and self.rows_a > 0

    @property
    def identical(self) -> bool:
        """Same shape and the same bytes."""
        return self.same_shape and not self.differ.any()

    @property
    def rows_differ(self) -> int:
        return int(self.differ.sum()) if self.same_shape else max(self.rows_a, self.rows_b)

    @property
    def first_row_differ(self) -> int | None:
        return _first(self.differ) if self.same_shape else 0

    @property
    def agree(self) -> np.ndarray:
        return self.top1_a == self.top1_b

    @property
    def argmax_agree(self) -> int:
        return int(self.agree.sum())

    @property
    def max_kl(self) -> float:
        """inf when nothing is comparable (row counts differ, or no rows)."""
        return float(self.kl.max()) if self.comparable else float("inf")

    @property
    def mean_kl(self) -> float:
        return float(self.kl.mean()) if self.comparable else float("inf")

    @property
    def max_abs(self) -> float:
        return float(np.nanmax(self.abs_diff)) if self.comparable else float("inf")

    # -------------------------------------------------------------- verdicts

    def bad_rows(self, rule: LogitsRule) -> np.ndarray:
        """Per row: it fails `rule`."""
        if rule.mode == "exact":
            return self.differ
        if rule.mode == "argmax":
            return ~self.agree
        return ~(np.isfinite(self.kl) & (self.kl <= rule.max_kl))

    def passes(self, rule: LogitsRule) -> bool:
        """Both sides have the same rows, at least one, and every row passes `rule`."""
        return self.comparable and not self.bad_rows(rule).any()

    def first_bad(self, rule: LogitsRule) -> int | None:
        """The first row that fails `rule` (0 when the sides cannot be compared row by row)."""
        return _first(self.bad_rows(rule)) if self.same_shape else 0

    # -------------------------------------------------------------- renderings

    def props(self) -> dict:
        return {"rows": self.rows_a, "rows_other": self.rows_b, "identical": self.identical,
                "rows_differ": self.rows_differ, "max_abs_err": self.max_abs,
                "argmax_agree": self.argmax_agree, "max_kl": self.max_kl}

    def text(self) -> str:
        if not self.same_shape:
            if self.rows_a == self.rows_b:
                return "row lengths differ (another vocabulary size)"
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


def _incomparable(rows_a: int, rows_b: int, same_shape: bool) -> LogitsDiff:
    """No row-by-row numbers: the shapes differ, or there are no rows."""
    e = np.zeros(0)
    i = e.astype(np.int64)
    return LogitsDiff(rows_a, rows_b, e.astype(bool), i, i, e, e, e, same_shape)


def _first(mask: np.ndarray) -> int | None:
    idx = np.nonzero(mask)[0]
    return int(idx[0]) if len(idx) else None


def compare_logits(a: np.ndarray, b: np.ndarray) -> LogitsDiff:
    if a.shape != b.shape or not a.size:
        return _incomparable(a.shape[0], b.shape[0], a.shape == b.shape)
    a32, b32 = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    differ = (a32.view(np.uint32) != b32.view(np.uint32)).any(axis=1)
    la, lb = log_softmax64(a), log_softmax64(b)
    top2 = np.sort(a, axis=1)[:, -2:] if a.shape[1] > 1 else np.repeat(a, 2, axis=1)
    return LogitsDiff(a.shape[0], b.shape[0], differ, a.argmax(axis=1), b.argmax(axis=1),
                      (np.exp(la) * (la - lb)).sum(axis=1),
                      np.abs(a.astype(np.float64) - b.astype(np.float64)).max(axis=1),
                      (top2[:, 1] - top2[:, 0]).astype(np.float64))


def drift(golden_rows: np.ndarray, current_rows: np.ndarray) -> LogitsDiff:
    """The rows both sides have, golden first; nothing comparable is an infinite drift."""
    n = min(len(golden_rows), len(current_rows))
    if n == 0 or golden_rows.shape[1:] != current_rows.shape[1:]:
        return _incomparable(0, 0, True)
    return compare_logits(np.asarray(golden_rows[:n]), np.asarray(current_rows[:n]))


def logits_verdict(diff: LogitsDiff, mode: str, max_kl: float) -> bool:
    """exact: byte-identical; argmax: every row's argmax agrees; kl: max KL <= max_kl."""
    return diff.passes(LogitsRule(mode, max_kl))
