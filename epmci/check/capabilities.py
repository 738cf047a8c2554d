"""The engine's capabilities as a check uses them (docs/engine-contract.md, Capabilities):
asked once with `--contract-info`, engine.features of epmci.yaml on top, checked against the
model; and the SKIP result of a suite that needs a feature the engine lacks -- reported in
every output, never dropped."""

from __future__ import annotations

from ..config.schema import CheckConfig
from ..contract.capabilities import INFO_FLAG, Capabilities, model_problem, probe, undeclared
from ..contract.process import EngineCommand
from ..gguf.file import ModelFile
from .result import SKIP, CheckResult


def declared(cfg: CheckConfig, engine: EngineCommand) -> tuple[Capabilities | None, str | None]:
    """(capabilities, None), or (None, why the engine cannot be gated: exit 2)."""
    caps, why = probe(engine, cfg.engine.timeout_s)
    override = cfg.engine.features
    if caps is not None:
        return (caps if override is None else caps.with_features(override, "engine.features")), None
    if override is not None:
        return undeclared(engine, override, f"engine.features ({INFO_FLAG}: {why})"), None
    return None, (f"{why} -- every engine must answer {INFO_FLAG} (docs/engine-contract.md, Capabilities); "
                  f"for one that cannot, declare its features in epmci.yaml (engine.features)")


def engine_for_model(caps: Capabilities, mf: ModelFile) -> str | None:
    """Why the engine, by its own declaration, cannot run this model (None: it can)."""
    return model_problem(caps, mf.hp.arch, {t.qtype.name for t in mf.tensors.values()})


def lacks(suite: str, name: str, missing: list[str], caps: Capabilities) -> CheckResult:
    """The one result of a suite (or of one of its checks) the engine cannot take part in."""
    has = ", ".join(sorted(caps.features)) or "no optional feature"
    return CheckResult(suite, name, SKIP, f"engine lacks {', '.join(missing)} ({caps.source} declares {has})",
                       {"skipped_by": "capability", "lacks": list(missing)})
