"""Binary outputs of the contract (docs/engine-contract.md): logits, MoE dumps, prefetch
dumps and delta-net state dumps.

All little-endian. Files are written to a temp name and renamed, so a reader never sees
half a file from a crashed run.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from .traces import Qwen35Trace

MOE_DUMP_MAGIC = b"EPMD"
MOE_DUMP_VERSION = 1          # routed experts only
MOE_DUMP_VERSION_SHARED = 2   # + the gated shared expert's output (qwen35moe)
STATE_DUMP_MAGIC = b"EPMR"
STATE_DUMP_VERSION = 1
PREFETCH_DUMP_MAGIC = b"EPMP"
PREFETCH_DUMP_VERSION = 1

def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_logits(path: str | os.PathLike, logits: np.ndarray) -> None:
    """int32 n_vocab, then float32 rows of n_vocab."""
    logits = np.ascontiguousarray(logits, dtype="<f4")
    write_atomic(path, struct.pack("<i", logits.shape[1]) + logits.tobytes())


class LayerFiles:
    """One dump file per layer, PREFIX.L, written as PREFIX.L.tmp and renamed on close, so
    a crash leaves no complete-looking dump."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.files: dict[int, object] = {}

    def file(self, layer: int):
        f = self.files.get(layer)
        if f is None:
            f = self.files[layer] = open(f"{self.prefix}.{layer}.tmp", "wb")
        return f

    def close(self) -> None:
        for layer, f in self.files.items():
            f.close()
            os.replace(f"{self.prefix}.{layer}.tmp", f"{self.prefix}.{layer}")
        self.files.clear()


class MoEDumpWriter(LayerFiles):
    """SDQ_MOE_DUMP=PREFIX: PREFIX.L gets one record per micro-batch of layer L (version 2,
    with the shared expert's output, for a model that has one)."""

    def write(self, t) -> None:
        f = self.file(t.layer)
        n, e = t.h.shape
        k = t.selected.shape[1]
        shared = t.shared if isinstance(t, Qwen35Trace) else None
        version = MOE_DUMP_VERSION if shared is None else MOE_DUMP_VERSION_SHARED
        f.write(MOE_DUMP_MAGIC + struct.pack("<5I", version, t.layer, n, e, k))
        fields = ((t.h, "<f4"), (t.selected, "<i4"), (t.weights, "<f4"), (t.out, "<f4"))
        for a, dt in fields + (() if shared is None else ((shared, "<f4"),)):
            f.write(np.ascontiguousarray(a, dtype=dt).tobytes())


class StateDumpWriter(LayerFiles):
    """SDQ_STATE_DUMP=PREFIX: PREFIX.L gets, for every delta-net layer L, one record per
    micro-batch: the layer's state after the micro-batch's last row."""

    def write(self, t) -> None:
        c, w = t.conv.shape
        v, ds, _ = t.ssm.shape
        self.file(t.layer).write(STATE_DUMP_MAGIC + struct.pack("<8I", STATE_DUMP_VERSION, t.layer, t.pos0,
                                                                   t.n_rows, c, w, v, ds)
                                 + np.ascontiguousarray(t.conv, dtype="<f4").tobytes()
                                 + np.ascontiguousarray(t.ssm, dtype="<f4").tobytes())


class PrefetchDumpWriter:
    """SDQ_PREFETCH_DUMP=PATH: one record per layer-ahead prediction, in the order they are
    made: the layer it was made at, the layer it predicts, the hidden state it was made from
    and each row's top-k. Written as PATH.tmp and renamed on close."""

    def __init__(self, path: str):
        self.path = path
        self.f = open(f"{path}.tmp", "wb")

    def write(self, t) -> None:
        n, e = t.x.shape
        self.f.write(PREFETCH_DUMP_MAGIC + struct.pack("<6I", PREFETCH_DUMP_VERSION, t.layer, t.target, n, e,
                                                       t.selected.shape[1])
                     + np.ascontiguousarray(t.x, dtype="<f4").tobytes()
                     + np.ascontiguousarray(t.selected, dtype="<i4").tobytes())

    def close(self) -> None:
        self.f.close()
        os.replace(f"{self.path}.tmp", self.path)
