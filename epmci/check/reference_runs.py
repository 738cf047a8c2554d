"""The reference's whole-model forward, memoized on disk: it is a pure function of the model
file, the token ids and the reference's own code, so its result is kept under the model
cache (`reference/<key>.npz`, key = sha256 of all three) and recomputed whenever any of them
changes. A faulty engine that generates other tokens simply misses the cache."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..fsutil import atomic_write
from ..gguf.file import ModelFile
from ..reference import reference_model
from ..synth.store import cache_dir

REFERENCE_SOURCES = Path(__file__).resolve().parent.parent / "reference"
KEEP = 16          # cached forwards kept (the newest); a few MiB each on the ci model


@dataclass
class WholeModel:
    logits: np.ndarray     # (positions, n_vocab) float32
    moe_in: np.ndarray     # (n_layer, positions, n_embd) float32: each layer's MoE input


@lru_cache(maxsize=1)
def reference_code_sha256() -> str:
    h = hashlib.sha256()
    for p in sorted(REFERENCE_SOURCES.rglob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def whole_model(mf: ModelFile, model_sha256: str, tokens: np.ndarray) -> WholeModel:
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    key = hashlib.sha256(f"{model_sha256}:{reference_code_sha256()}:".encode() + tokens.tobytes()).hexdigest()
    path = cache_dir() / "reference" / f"{key[:32]}.npz"
    if path.exists():
        try:
            with np.load(path) as z:
                return WholeModel(z["logits"], z["moe_in"])
        except (OSError, ValueError, KeyError):
            pass                                   # unreadable: recompute and replace it
    f = reference_model(mf).forward(tokens)
    out = WholeModel(f.logits, np.stack(f.moe_in))
    buf = io.BytesIO()
    np.savez(buf, logits=out.logits, moe_in=out.moe_in)
    atomic_write(path, buf.getvalue())
    for old in sorted(path.parent.glob("*.npz"), key=lambda p: p.stat().st_mtime)[:-KEEP]:
        old.unlink(missing_ok=True)
    return out
