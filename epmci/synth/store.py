"""The per-user model cache: made models are keyed by preset, seed and generator version."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from ..errors import InputError
from .presets import PRESETS, Preset
from .shapes import shape
from .writer import Progress, write_model

DEFAULT_SEED = 0


def cache_dir() -> Path:
    """$EPMCI_CACHE_DIR, else $XDG_CACHE_HOME/epmci, else ~/.cache/epmci."""
    if os.environ.get("EPMCI_CACHE_DIR"):
        return Path(os.environ["EPMCI_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "epmci"


def cached_model_path(preset: str, seed: int = DEFAULT_SEED) -> Path:
    return cache_dir() / "models" / f"{preset}-seed{seed}-gen{PRESETS[preset].generator_version}.gguf"


def resolve_model(model: str) -> Path:
    """A preset name (made on first use into the model cache) or a path to a GGUF."""
    p = Path(model).expanduser()
    if model in PRESETS and not p.exists():
        return make_model(model)
    if not p.exists():
        raise InputError(model, "no such model file (and not a preset: "
                                f"{', '.join(PRESETS)})")
    return p.resolve()


def make_model(preset: str, seed: int = DEFAULT_SEED, out: str | os.PathLike | None = None,
               progress: Progress | None = None) -> Path:
    """Return the model for (preset, seed), making it if needed.

    With `out`, the model is written there; otherwise into the cache, where it is reused.
    Concurrent callers (parallel test workers) wait on a lock instead of racing.
    """
    if preset not in PRESETS:
        raise InputError(preset, f"unknown preset (choose from {', '.join(PRESETS)})")
    if seed < 0:
        raise InputError(seed, "seed must be >= 0")
    if out is not None:
        return write_model(PRESETS[preset], seed, Path(out), progress)
    return _cached(PRESETS[preset], seed, cached_model_path(preset, seed), progress)


def shape_model(seed: int) -> Path:
    """The model of generated shape `seed` (epmci/synth/shapes.py), made into the model cache
    on first use; keyed by the shape itself, so a generator change makes a new file."""
    p = shape(seed)
    key = hashlib.sha256(f"{p!r} {p.generator_version}".encode()).hexdigest()[:12]
    return _cached(p, DEFAULT_SEED, cache_dir() / "shapes" / f"{p.name}-{key}.gguf")


def _cached(p: Preset, seed: int, path: Path, progress: Progress | None = None) -> Path:
    """`path`, made once: concurrent callers (parallel test workers) wait on a lock instead
    of racing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            write_model(p, seed, path, progress)
    return path
