"""A model file's identity, the key of its golden baselines: `<preset>-seed<seed>-gen<generator
version>` for a model made by epmci (from its GGUF metadata), else `sha256-<16 hex digits>`;
the file's sha256 either way."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .file import ModelFile


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def model_identity(path: str | os.PathLike) -> dict:
    """{id, preset, seed, generator_version, sha256, bytes} of a model file."""
    p = Path(path)
    mf = ModelFile(p)
    preset = mf.meta("epmci.preset", None)
    seed = mf.meta("epmci.seed", None)
    gen = mf.meta("epmci.generator_version", None)
    sha = file_sha256(p)
    if preset is not None and seed is not None and gen is not None:
        mid = f"{preset}-seed{int(seed)}-gen{int(gen)}"
        preset, seed, gen = str(preset), int(seed), int(gen)
    else:
        mid = f"sha256-{sha[:16]}"
    return {"id": mid, "preset": preset, "seed": seed, "generator_version": gen, "sha256": sha,
            "bytes": p.stat().st_size}
