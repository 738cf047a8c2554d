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


def made_by_epmci(mf: ModelFile) -> tuple[str, int, int] | None:
    """(preset, seed, generator version) of a model epmci made, from its metadata; else None."""
    preset = mf.meta("epmci.preset", None)
    seed = mf.meta("epmci.seed", None)
    gen = mf.meta("epmci.generator_version", None)
    if preset is None or seed is None or gen is None:
        return None
    return str(preset), int(seed), int(gen)


def model_identity(path: str | os.PathLike) -> dict:
    """{id, preset, seed, generator_version, sha256, bytes} of a model file."""
    p = Path(path)
    made = made_by_epmci(ModelFile(p))
    sha = file_sha256(p)
    preset, seed, gen = made or (None, None, None)
    mid = f"{preset}-seed{seed}-gen{gen}" if made else f"sha256-{sha[:16]}"
    return {"id": mid, "preset": preset, "seed": seed, "generator_version": gen, "sha256": sha,
            "bytes": p.stat().st_size}


def model_key(mf: ModelFile) -> str:
    """Which model a file is, without reading all of it where its metadata says: a model
    epmci made is its preset, seed, generator and size (made the same, byte for byte, on
    every machine); any other is its sha256."""
    made = made_by_epmci(mf)
    if made:
        return f"{made[0]}-seed{made[1]}-gen{made[2]}-{os.path.getsize(mf.path)}B"
    return f"sha256-{file_sha256(mf.path)}"
