"""Elementwise comparison of engine output with the reference, as data plus one-line text."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Tolerance:
    """An engine value e passes against the reference value r when |e - r| <= atol + rtol*|r|
    elementwise (and is not NaN). 0/0 means bit-for-bit equal (except the sign of zero)."""
    atol: float = 0.0
    rtol: float = 0.0


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
