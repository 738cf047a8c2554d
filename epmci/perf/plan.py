"""The plan of a perf comparison, resolved once: the model's identity and its golden baseline
for the profile, this machine's fingerprint, the measurement settings, and each scenario's
runs (one RunSpec per prompt of perf.prompts). Shared by the perf suite and golden recording."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config.experiments import EXPERIMENTS
from ..config.schema import CheckConfig
from ..contract.promises import Promises
from ..contract.runspec import RunSpec
from ..errors import InputError
from ..gguf.facts import ModelFacts
from ..gguf.file import ModelFile
from ..gguf.identity import model_identity
from . import abba
from .golden import Golden, find, golden_path, golden_root
from .machine import fingerprint
from .settings import for_model


@dataclass
class PerfPlan:
    cfg: CheckConfig
    facts: ModelFacts
    model_id: dict
    golden: Golden | None
    golden_file: Path
    profile: str
    machine: dict
    settings: dict
    specs: dict = field(default_factory=dict)     # scenario -> [RunSpec per prompt]
    repeats: int = 3
    base_sha: str | None = None
    repo: Path | None = None
    engine: dict | None = None                    # the identity of the engine measured (Capabilities.identity)
    promises: Promises | None = None              # every measured paged run is held to them

    def record_hint(self, other_profile: bool = False) -> str:
        return f"epmci golden update --profile {'<profile>' if other_profile else self.profile} --reason \"...\""

    def scenario_specs(self, name: str, routing: str | None = None) -> list[RunSpec]:
        """The scenario's run per prompt; `routing`: the --profile-out file its hot pins read."""
        return [scenario_spec(self.cfg, self.facts, name, p, routing) for p in self.cfg.perf.prompts]


def scenario_spec(cfg: CheckConfig, facts: ModelFacts, name: str, prompt: str, routing: str | None = None) -> RunSpec:
    """Scenario `name`'s run of `prompt` with the perf settings of cfg (derived for the model)."""
    pc = cfg.perf
    fixed = {"n_predict": pc.n_predict, "ctx": pc.ctx, "batch": pc.batch, "threads": cfg.engine.threads,
             "arena_fraction": pc.arena_fraction, "ram_budget_mb": pc.ram_budget_mb}
    return EXPERIMENTS[name].spec(prompt, fixed, facts, routing)


def timed_scenario(cfg: CheckConfig, model: Path, name: str = "baseline") -> tuple[CheckConfig, ModelFacts, RunSpec]:
    """What the perf suite times for scenario `name` on `model` (its first prompt's run), for
    the benchmarks that measure it outside a check: the settings derived for the model, its
    facts, the run."""
    mf = ModelFile(model)
    cfg, _ = for_model(cfg, mf)
    facts = ModelFacts.of(mf, cfg.run.slot_align, cfg.run.slot_windows)
    return cfg, facts, scenario_spec(cfg, facts, name, cfg.perf.prompts[0])


def perf_settings(cfg: CheckConfig) -> dict:
    pc = cfg.perf
    return {"prompts": list(pc.prompts), "n_predict": pc.n_predict, "batch": pc.batch, "ctx": pc.ctx,
            "threads": cfg.engine.threads, "ram_budget_mb": pc.ram_budget_mb, "golden_rows": pc.golden_rows}


def prepare(cfg: CheckConfig, model_path: Path, facts: ModelFacts, engine: dict, load_golden: bool = True) -> PerfPlan:
    """Golden lookup (InputError for an unusable golden file: exit 2) and run settings for
    `engine` (its identity)."""
    pc = cfg.perf
    ident = model_identity(model_path)
    root = golden_root(pc.golden_dir, cfg.source)
    gfile = golden_path(root, pc.profile, ident["id"])
    golden = find(root, pc.profile, ident["id"]) if load_golden else None
    if golden is not None and golden.model.get("sha256") != ident["sha256"]:
        raise InputError(gfile, f"recorded for model sha256 {golden.model['sha256'][:16]}..., but "
                                f"{model_path} has sha256 {ident['sha256'][:16]}... (same id {ident['id']}): "
                                f"the model generator changed without a version bump, or the file is damaged")
    plan = PerfPlan(cfg, facts, ident, golden, gfile, pc.profile, fingerprint(model_path.parent),
                    perf_settings(cfg), engine=engine,
                    promises=Promises.of(ModelFile(model_path), cfg.run.slot_align, cfg.run.slot_windows))
    plan.repeats = pc.repeats
    for name in pc.scenarios:
        plan.specs[name] = plan.scenario_specs(name)
    if pc.base and load_golden:
        start = Path(cfg.source).parent if cfg.source not in (None, "<defaults>") else Path.cwd()
        plan.repo = abba.repo_root(start)
        plan.base_sha = abba.resolve_ref(plan.repo, pc.base)
    return plan
