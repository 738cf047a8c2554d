"""The settings of a run on one model and this machine: epmci.yaml's `auto` values made
concrete (config/derive.py) from the model file's facts and the machine's memory limit.
Every command that runs engines on a model takes its settings through here."""

from __future__ import annotations

from ..config.derive import resolve
from ..config.schema import CheckConfig
from ..gguf.facts import ModelFacts
from ..gguf.file import ModelFile
from ..cgroups import memory_limit_mib


def for_model(cfg: CheckConfig, mf: ModelFile) -> tuple[CheckConfig, list[str]]:
    """(cfg with every `auto` derived for this model and machine, a line per derived value)."""
    return resolve(cfg, ModelFacts.of(mf, cfg.run.slot_align, cfg.run.slot_windows), memory_limit_mib())
