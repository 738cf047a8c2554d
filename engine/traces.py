"""What the forward passes report per layer and micro-batch (the MoE and state dumps are
written from these): plain records, no kernels, so the contract's outputs (engine/dumps.py)
and `--contract-info` do not load numba."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class MoETrace:
    """One layer's MoE for one micro-batch: input rows, routing and output rows."""
    layer: int
    h: np.ndarray
    selected: np.ndarray   # (n, k) int32, selection order
    weights: np.ndarray    # (n, k) float32, renormalized
    out: np.ndarray


@dataclass
class Qwen35Trace(MoETrace):
    """A layer's MoE for one micro-batch (MoETrace: the routed experts) and its gated
    shared expert's output, kept apart."""
    shared: np.ndarray | None = None


@dataclass
class PredictionTrace:
    """A layer-ahead prediction: made at the start of `layer` for `target`, from the hidden
    state `x` (the layer's input rows), and the experts it selected per row."""
    layer: int
    target: int
    x: np.ndarray
    selected: np.ndarray   # (n, k) int32, selection order


@dataclass
class StateTrace:
    """A delta-net layer's state after the last row of a micro-batch (copies)."""
    layer: int
    pos0: int        # position of the micro-batch's first row
    n_rows: int
    conv: np.ndarray   # (conv_dim, Kc-1) float32
    ssm: np.ndarray    # (V, ds, ds) float32, [j, m, i] = S_j[i][m]
