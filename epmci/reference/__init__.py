"""The independent NumPy reference: ggml's CPU numerics, read from the model file, never the engine."""

from __future__ import annotations

from ..gguf.file import QWEN35, ModelFile
from .model import ReferenceModel
from .qwen35moe import Qwen35Model


def reference_model(mf: ModelFile) -> ReferenceModel:
    """The reference forward for the file's architecture (qwen3moe or qwen35moe)."""
    return Qwen35Model(mf) if mf.hp.arch == QWEN35 else ReferenceModel(mf)
