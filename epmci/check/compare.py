"""Numerical comparisons of engine output with the reference, as data plus one-line text."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import Tolerance


@dataclass
class ArrayDiff:
    n: int                      # values compared
    n_bad: int                  # values outside the tolerance (NaN counts as bad)
    max_abs: float              # max |got - ref| over finite pairs
    max_rel: float              # max_abs / max |ref|
    ref_scale: float            # max |ref|
    worst: tuple[int, ...] | None
    bad_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    n_nan: int = 0
    shape_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.shape_error is None and self.n > 0 and self.n_bad == 0

    def props(self, prefix: str = "") -> dict:
        if self.shape_error:
            return {prefix + "shape_error": self.shape_error}
        return {prefix + "values": self.n, prefix + "values_outside_tol": self.n_bad,
                prefix + "max_abs_err": self.max_abs, prefix + "max_rel_err": self.max_rel,
                prefix + "rows_differ": int(len(self.bad_rows)), prefix + "nan": self.n_nan}

    def text(self, tol: Tolerance | None = None) -> str:
        if self.shape_error:
            return self.shape_error
        if self.n == 0:
            return "nothing to compare (empty)"
        t = f" (tol atol={tol.atol:g} rtol={tol.rtol:g})" if tol is not None else ""
        s = f"max_abs_err {self.max_abs:.3g}, max_rel_err {self.max_rel:.3g}{t}"
        if self.n_bad:
            s += f", {self.n_bad}/{self.n} values in {len(self.bad_rows)} rows outside"
            if self.worst is not None:
                s += f", worst at {list(self.worst)}"
        if self.n_nan:
            s += f", {self.n_nan} NaN"
        return s


def compare_arrays(got: np.ndarray, ref: np.ndarray, tol: Tolerance) -> ArrayDiff:
    """|got - ref| <= atol + rtol*|ref| elementwise; NaN anywhere in got is a mismatch."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    if got.shape != ref.shape:
        return ArrayDiff(0, 0, 0.0, 0.0, 0.0, None,
                         shape_error=f"shape {list(got.shape)} differs from the reference's {list(ref.shape)}")
    if got.size == 0:
        return ArrayDiff(0, 0, 0.0, 0.0, 0.0, None)
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    nan = ~np.isfinite(g) & ~(g == r)   # NaN (never equal) or an inf the reference lacks
    with np.errstate(invalid="ignore"):
        d = np.abs(g - r)
        bad = (d > tol.atol + tol.rtol * np.abs(r)) | nan
    finite = np.isfinite(d)
    max_abs = float(d[finite].max()) if finite.any() else 0.0
    scale = float(np.abs(r[np.isfinite(r)]).max()) if np.isfinite(r).any() else 0.0
    worst = None
    if bad.any():
        dd = np.where(finite, d, np.inf)
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(dd)), d.shape))
    rows = np.nonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0] if bad.ndim > 1 else np.nonzero(bad)[0]
    return ArrayDiff(int(got.size), int(bad.sum()), max_abs, max_abs / scale if scale else max_abs,
                     scale, worst, rows, int(nan.sum()))


# ------------------------------------------------------------------ logits

def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@dataclass
class LogitsDiff:
    rows_a: int
    rows_b: int
    identical: bool            # same shape and the same bytes
    rows_differ: int
    first_row_differ: int | None
    max_abs: float
    argmax_agree: int          # rows whose argmax (first maximum) agrees
    max_kl: float              # max over rows of KL(softmax(a) || softmax(b)), nats

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


def compare_logits(a: np.ndarray, b: np.ndarray) -> LogitsDiff:
    """a: the reference side (e.g. --no-pager or the first run), b: the side under test."""
    if a.shape != b.shape:
        return LogitsDiff(a.shape[0], b.shape[0], False, max(a.shape[0], b.shape[0]), 0,
                          float("inf"), 0, float("inf"))
    identical = a.tobytes() == b.tobytes()
    neq = (a.view(np.uint32) != b.view(np.uint32)).any(axis=1) if a.size else np.zeros(0, bool)
    rows = np.nonzero(neq)[0]
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    max_abs = float(np.nanmax(d)) if d.size else 0.0
    agree = int((a.argmax(axis=1) == b.argmax(axis=1)).sum()) if a.size else 0
    if a.size:
        la, lb = log_softmax64(a), log_softmax64(b)
        kl = float(np.max((np.exp(la) * (la - lb)).sum(axis=1)))
    else:
        kl = 0.0
    return LogitsDiff(a.shape[0], b.shape[0], identical, int(len(rows)),
                      int(rows[0]) if len(rows) else None, max_abs, agree, kl)


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
