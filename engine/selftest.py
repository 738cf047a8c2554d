"""`--selftest L:E:N:OUT`: one expert through the paged path, for the gate's kernel check;
repeatable (feature selftest_batch): each in turn, in one process.

Expert E of layer L is read into an arena slot by the pager (the same read path as a
run), computed from the slot with the forward pass's own expert function on N
deterministic rows, and written to OUT (format in docs/engine-contract.md):

    b"EPMS", uint32 version=1, layer, expert, n_rows, n_embd,
    sha256 of the slot's gate+up+down bytes (32 B), float32 x[N][n_embd], float32 y[N][n_embd]
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from .dumps import write_atomic
from .gguf_model import ModelError
from .kernels import Activation
from .model import experts_ffn

SELFTEST_MAGIC = b"EPMS"
SELFTEST_VERSION = 1


def selftest_inputs(layer: int, expert: int, n: int, n_embd: int) -> np.ndarray:
    return np.random.default_rng([layer, expert, n]).standard_normal((n, n_embd)).astype(np.float32)


def parse_spec(spec: str, n_layer: int, n_expert: int) -> tuple[int, int, int, str]:
    parts = spec.split(":", 3)
    if len(parts) != 4 or not parts[3]:
        raise ModelError(f"--selftest {spec!r}: expected L:E:N:OUT")
    try:
        layer, expert, n = (int(v) for v in parts[:3])
    except ValueError:
        raise ModelError(f"--selftest {spec!r}: L, E and N must be integers") from None
    if not 0 <= layer < n_layer:
        raise ModelError(f"--selftest: layer {layer} out of range (model has {n_layer})")
    if not 0 <= expert < n_expert:
        raise ModelError(f"--selftest: expert {expert} out of range (model has {n_expert})")
    if n < 1:
        raise ModelError(f"--selftest: N must be >= 1, got {n}")
    return layer, expert, n, parts[3]


def run_selftests(engine, specs: list[str]) -> None:
    """Every --selftest in turn, after checking them all: one out of range writes nothing."""
    hp = engine.gm.hp
    for spec in specs:
        parse_spec(spec, hp.n_layer, hp.n_expert)
    for spec in specs:
        run_selftest(engine, spec)


def run_selftest(engine, spec: str) -> dict:
    """Run the selftest on an Engine built with the pager; returns what was written."""
    from .paging.pager import Pager
    hp = engine.gm.hp
    layer, expert, n, out = parse_spec(spec, hp.n_layer, hp.n_expert)
    pager = engine.experts
    if not isinstance(pager, Pager):
        raise ModelError("--selftest: needs the pager (drop --no-pager)")
    slot, (g, u, d) = pager.load_slot(layer, expert)
    try:
        digest = hashlib.sha256()
        for part in (g, u, d):
            digest.update(np.ascontiguousarray(part).data)
        sha = digest.digest()
        x = selftest_inputs(layer, expert, n, hp.n_embd)
        y = experts_ffn([(g, u, d)], engine.model.expert_types(layer), Activation(x), [np.arange(n)])
    finally:
        pager.release(layer)
    data = (SELFTEST_MAGIC + struct.pack("<5I", SELFTEST_VERSION, layer, expert, n, hp.n_embd) + sha
            + np.ascontiguousarray(x, dtype="<f4").tobytes() + np.ascontiguousarray(y, dtype="<f4").tobytes())
    write_atomic(out, data)
    return {"layer": layer, "expert": expert, "slot": slot, "sha256": sha, "x": x, "y": y}

