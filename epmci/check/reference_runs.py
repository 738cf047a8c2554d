"""The reference's whole-model forward, memoized on disk: it is a pure function of the model
file, the token ids and the reference's own code, so its result is kept under the model
cache (`reference/<key>.npz`, key = sha256 of all three) and recomputed whenever any of them
changes. A faulty engine that generates other tokens simply misses the cache."""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..fsutil import atomic_write, keep_newest
from ..gguf.file import ModelFile
from ..reference import reference_model
from ..synth.store import cache_dir

REFERENCE_SOURCES = Path(__file__).resolve().parent.parent / "reference"
KEEP = 16          # cached forwards kept (the newest); a few MiB each on the ci model, ~20 MiB with ci35's states


@dataclass
class WholeModel:
    logits: np.ndarray     # (positions, n_vocab) float32
    moe_in: np.ndarray     # (n_layer, positions, n_embd) float32: each layer's MoE input
    # qwen35moe: the delta-net layers' state after each position asked for
    state_positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    state_layers: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    conv: np.ndarray | None = None   # (positions asked, delta-net layers, conv_dim, Kc-1)
    ssm: np.ndarray | None = None    # (positions asked, delta-net layers, V, ds, ds)

    def state(self, position: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(conv, ssm) of a delta-net layer after a position asked for."""
        p = int(np.nonzero(self.state_positions == position)[0][0])
        lay = int(np.nonzero(self.state_layers == layer)[0][0])
        return self.conv[p, lay], self.ssm[p, lay]


def memo_dir() -> Path:
    """Where the memoized forwards are kept (under the model cache)."""
    return cache_dir() / "reference"


@lru_cache(maxsize=1)
def reference_code_sha256() -> str:
    h = hashlib.sha256()
    for p in sorted(REFERENCE_SOURCES.rglob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def whole_model(mf: ModelFile, model_sha256: str, tokens: np.ndarray, state_after=()) -> WholeModel:
    """The forward of `tokens` from the sequence start; with `state_after` (positions), the
    delta-net layers' states after each of them too (qwen35moe)."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    positions = np.array(sorted({int(p) for p in state_after}), dtype=np.int64)
    key = hashlib.sha256(f"{model_sha256}:{reference_code_sha256()}:".encode() + tokens.tobytes()
                         + positions.tobytes()).hexdigest()
    path = memo_dir() / f"{key[:32]}.npz"
    if path.exists():
        try:
            with np.load(path) as z:
                states = {k: z[k] for k in ("state_positions", "state_layers", "conv", "ssm") if k in z}
                return WholeModel(z["logits"], z["moe_in"], **states)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass                                   # unreadable: recompute and replace it
    # only the qwen35moe forward has states to keep (and takes state_after)
    f = reference_model(mf).forward(tokens, **({"state_after": positions} if len(positions) else {}))
    out = WholeModel(f.logits, np.stack(f.moe_in))
    arrays = {"logits": out.logits, "moe_in": out.moe_in}
    if len(positions):
        layers = sorted(f.states[int(positions[0])])
        out.state_positions, out.state_layers = positions, np.array(layers, dtype=np.int64)
        out.conv, out.ssm = (np.stack([np.stack([getattr(f.states[int(p)][il], part) for il in layers])
                                       for p in positions]) for part in ("conv", "ssm"))
        arrays.update(state_positions=out.state_positions, state_layers=out.state_layers, conv=out.conv, ssm=out.ssm)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write(path, buf.getvalue())
    keep_newest(path.parent, "*.npz", KEEP)
    return out
