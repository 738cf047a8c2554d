"""What an engine declares it can do (docs/engine-contract.md, Capabilities): `ENGINE
--contract-info` prints one JSON object -- the contract version it speaks, its name and
version, the architectures and weight types it runs, and the optional features it
implements. epmci asks once per check; engine.features in epmci.yaml may override the
features (or declare them for an engine that cannot answer).

Suites that need a feature the engine lacks are skipped with "engine lacks <feature>", and
the pager's flags go only to an engine that declares the pager.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .outputs import ContractError
from .process import EngineCommand, run_engine

CONTRACT_VERSION = 2
INFO_FLAG = "--contract-info"
# The optional features of the contract, each a section of docs/engine-contract.md.
FEATURES = {
    "pager": "the expert pager: --arena-mb, --ram-budget-mb, --no-prefetch, the SDQ_* switches, and "
             "--no-pager for the resident side of the A/B",
    "selftest": "--selftest L:E:N:OUT (needs the pager)",
    "selftest_batch": "--selftest given more than once: each in turn, in one process (needs selftest)",
    "moe_dump": "SDQ_MOE_DUMP=PREFIX",
    "prefetch_dump": "SDQ_PREFETCH_DUMP=PATH (every layer-ahead prediction, needs the pager)",
    "state_dump": "SDQ_STATE_DUMP=PREFIX (the delta-net states of a qwen35moe model)",
    "profile": "--profile-out PATH and SDQ_PROFILE_IN hot pins (needs the pager)",
    "pacing": "--pace-fds R,W",
    "teacher_forcing": "--tokens-in FILE",
    "reference_exact": "logits bit-identical to epmci's reference (ggml's generic C order): compared exactly",
}


@dataclass(frozen=True)
class Capabilities:
    contract: int | None                 # None: not declared (features from engine.features)
    name: str                            # the engine's name, or its command line when undeclared
    version: str | None
    architectures: tuple[str, ...]
    quant_types: tuple[str, ...]
    features: frozenset[str]
    source: str                          # where this came from (--contract-info, epmci.yaml)
    raw: dict = field(default_factory=dict, compare=False)
    kernel_paths: tuple[str, ...] = ()   # `--kernels P` values it has (optional key kernel_paths)
    # the CPU flags (/proc/cpuinfo names) each path needs, for the paths that say (kernel_cpu_flags)
    kernel_cpu_flags: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)

    def has(self, feature: str) -> bool:
        return feature in self.features

    def lacking(self, features) -> list[str]:
        return [f for f in features if f not in self.features]

    def identity(self, engine: EngineCommand) -> dict:
        """Whose results these are, as golden baselines record it (keyed by the name)."""
        return {"name": self.name, "version": self.version, "contract": self.contract, "command": engine.describe()}

    def to_dict(self) -> dict:
        return {"contract": self.contract, "name": self.name, "version": self.version,
                "architectures": list(self.architectures), "quant_types": list(self.quant_types),
                "features": sorted(self.features), "source": self.source, "kernel_paths": list(self.kernel_paths),
                "kernel_cpu_flags": {p: list(f) for p, f in self.kernel_cpu_flags.items()}}

    def with_features(self, features: list[str], why: str) -> "Capabilities":
        return Capabilities(self.contract, self.name, self.version, self.architectures, self.quant_types,
                            frozenset(features), f"{self.source}, features from {why}", self.raw, self.kernel_paths,
                            self.kernel_cpu_flags)


def parse_contract_info(text: str, where: str) -> Capabilities:
    """The JSON object `--contract-info` printed; ContractError naming what is wrong."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ContractError(where, f"{INFO_FLAG} did not print one JSON object ({e.msg})") from None
    if not isinstance(d, dict):
        raise ContractError(where, f"{INFO_FLAG} printed {type(d).__name__}, not a JSON object")
    contract = d.get("contract")
    if not isinstance(contract, int) or isinstance(contract, bool):
        raise ContractError(where, f"{INFO_FLAG}: `contract` must be the contract version (an integer), "
                                   f"got {contract!r}")
    eng = d.get("engine")
    if not isinstance(eng, dict) or not isinstance(eng.get("name"), str) or not eng["name"].strip():
        raise ContractError(where, f"{INFO_FLAG}: `engine` must be an object with a non-empty `name`")
    lists = {}
    for key in ("architectures", "quant_types", "features"):
        v = d.get(key)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ContractError(where, f"{INFO_FLAG}: `{key}` must be a list of strings, got {v!r}")
        lists[key] = v
    paths = d.get("kernel_paths", [])
    if not isinstance(paths, list) or not all(isinstance(x, str) and x.strip() and x != "auto" for x in paths):
        raise ContractError(where, f"{INFO_FLAG}: `kernel_paths` must be a list of path names (not auto), got {paths!r}")
    flags = d.get("kernel_cpu_flags", {})
    if not (isinstance(flags, dict) and all(p in paths and isinstance(f, list) and
                                            all(isinstance(x, str) and x.strip() for x in f) for p, f in flags.items())):
        raise ContractError(where, f"{INFO_FLAG}: `kernel_cpu_flags` must map declared kernel paths to lists of "
                                   f"CPU flag names, got {flags!r}")
    version = eng.get("version")
    return Capabilities(contract, eng["name"].strip(), None if version is None else str(version),
                        tuple(lists["architectures"]), tuple(lists["quant_types"]),
                        frozenset(lists["features"]), INFO_FLAG, d, tuple(paths),
                        {p: tuple(f) for p, f in flags.items()})


def probe(engine: EngineCommand, timeout: float) -> tuple[Capabilities | None, str | None]:
    """Ask the engine (`ENGINE --contract-info`): (capabilities, None), or (None, why not)."""
    run = run_engine(engine, [INFO_FLAG], timeout=timeout, label="contract info")
    if not run.ok:
        return None, f"`{engine.describe()} {INFO_FLAG}` failed: {run.failure()}"
    try:
        return parse_contract_info(run.stdout.decode("utf-8", "replace"), engine.describe()), None
    except ContractError as e:
        return None, e.problem


def undeclared(engine: EngineCommand, features: list[str], why: str) -> Capabilities:
    """An engine that does not answer --contract-info, with the features epmci.yaml declares."""
    return Capabilities(None, engine.describe(), None, (), (), frozenset(features), why)


def model_problem(caps: Capabilities, arch: str, weight_types: set[str]) -> str | None:
    """Why the engine cannot run this model by its own declaration (None: it says it can).
    Nothing is known of an engine that declared nothing."""
    if caps.contract is None:
        return None
    if arch not in caps.architectures:
        return (f"{caps.name} runs {', '.join(caps.architectures) or 'no architecture'} by its {INFO_FLAG}, "
                f"not {arch}")
    missing = sorted(weight_types - set(caps.quant_types))
    if missing:
        return (f"unsupported type{'s' * (len(missing) > 1)} {', '.join(missing)}: {caps.name} declares the "
                f"weight types {', '.join(caps.quant_types)} by its {INFO_FLAG}")
    return None
