"""Binary outputs of the contract (docs/engine-contract.md): logits and MoE dumps.

All little-endian. Files are written to a temp name and renamed, so a reader never sees
half a file from a crashed run.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import numpy as np

MOE_DUMP_MAGIC = b"EPMD"
MOE_DUMP_VERSION = 1


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


class MoEDumpWriter:
    """SDQ_MOE_DUMP=PREFIX: PREFIX.L gets one record per micro-batch of layer L.

    Written to PREFIX.L.tmp and renamed on close, so a crash leaves no complete-looking dump.
    """

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.files: dict[int, object] = {}

    def write(self, t) -> None:
        f = self.files.get(t.layer)
        if f is None:
            f = self.files[t.layer] = open(f"{self.prefix}.{t.layer}.tmp", "wb")
        n, e = t.h.shape
        k = t.selected.shape[1]
        f.write(MOE_DUMP_MAGIC + struct.pack("<5I", MOE_DUMP_VERSION, t.layer, n, e, k))
        for a, dt in ((t.h, "<f4"), (t.selected, "<i4"), (t.weights, "<f4"), (t.out, "<f4")):
            f.write(np.ascontiguousarray(a, dtype=dt).tobytes())

    def close(self) -> None:
        for layer, f in self.files.items():
            f.close()
            os.replace(f"{self.prefix}.{layer}.tmp", f"{self.prefix}.{layer}")
        self.files.clear()
