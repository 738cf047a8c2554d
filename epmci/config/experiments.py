"""The experiment catalog: named engine settings, from the original project's experiment
harness, on this engine's knobs. An experiment is data: engine flag overrides (`args`) and
environment overrides (`env`) on top of fixed measurement conditions (FIXED). `epmci bench`
runs matrices of them (MATRICES, chosen with `--suite`); the perf suite of `epmci check`
names its scenarios from the same catalog (perf.scenarios in epmci.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..contract.runspec import RunSpec
from ..errors import InputError
from ..gguf.facts import ModelFacts
from ..contract.memory import arena_room_mib, min_arena_mib
from ..units import MiB, arena_mib

ROUTING_PROFILE = "{routing_profile}"   # env placeholder: a --profile-out file of a baseline run
PAGER_ARGS = frozenset({"arena_fraction", "arena_mb", "no_prefetch"})   # args only a pager takes

FIXED = {
    "n_predict": 32,
    "ctx": 256,
    "batch": 8,
    "threads": 1,
    "arena_fraction": 0.25,     # of all expert bytes
    "ram_budget_mb": 1024.0,
}

PROMPTS = [
    "Write a short paragraph about how mixture-of-experts models route tokens.",
    "請用三句話說明什麼是 SSD、RAM、CPU 之間的資料分層。",
]


@dataclass(frozen=True)
class Experiment:
    name: str
    args: dict = field(default_factory=dict)   # threads, batch, arena_fraction, arena_mb, no_prefetch
    env: dict = field(default_factory=dict)    # SDQ_* overrides
    note: str = ""

    def spec(self, prompt: str, fixed: dict, facts: ModelFacts, routing_profile: str | None = None) -> RunSpec:
        """The run of this experiment on `prompt`: FIXED-like conditions overridden by args/env.
        An arena fraction of the model's expert bytes is raised to the minimum arena of the
        run's batch and slot layout (the engine refuses an arena below it)."""
        a = {**fixed, **self.args}
        env = {k: (routing_profile or "") if v == ROUTING_PROFILE else str(v) for k, v in self.env.items()}
        batch = int(a["batch"])
        arena_mb = a.get("arena_mb")
        spec = RunSpec(prompt, n_predict=int(a["n_predict"]), batch=batch, ctx=int(a["ctx"]),
                       threads=int(a["threads"]), arena_mb=arena_mb, ram_budget_mb=a.get("ram_budget_mb"),
                       prefetch=not a.get("no_prefetch", False), env=env)
        if arena_mb is None and a.get("arena_fraction") is not None:
            want = int(a["arena_fraction"] * facts.total_expert_bytes())
            room = arena_room_mib(spec.ram_budget_mb, spec, facts)   # the fraction gives way to the budget
            if room is not None:
                want = min(want, int(room * MiB))
            spec.arena_mb = max(arena_mib(want), min_arena_mib(spec, facts))
        return spec

    @property
    def needs_routing_profile(self) -> bool:
        return ROUTING_PROFILE in self.env.values()

    @property
    def requires(self) -> tuple[str, ...]:
        """The contract features an engine needs to run it (the SDQ_* switches are the pager's)."""
        pager = bool(self.env) or bool(PAGER_ARGS & set(self.args))
        return ("pager",) * pager + ("profile",) * self.needs_routing_profile


def _x(name: str, note: str = "", env: dict | None = None, **args) -> Experiment:
    return Experiment(name, dict(args), dict(env or {}), note)


_CATALOG = [
    _x("baseline", "FIXED conditions: 25% arena, -b 8, prefetch layer-ahead 1, 4 reader threads"),
    *[_x(f"threads={t}", "compute threads; outputs must not change", threads=t) for t in (2, 4)],
    _x("prefetch=off", "no prefetch: pure LRU", no_prefetch=True),
    _x("fadvise=on", "drop every expert range from the page cache after its read",
       env={"SDQ_FADV_DONTNEED": "1"}),
    *[_x(f"arena={p}%", "arena size sweep", arena_fraction=p / 100) for p in (15, 35, 50)],
    *[_x(f"batch={b}", "prefill micro-batch", batch=b) for b in (4, 16)],
    *[_x(f"io-threads={n}", "reader threads", env={"SDQ_IO_THREADS": str(n)}) for n in (1, 2, 8, 16)],
    _x("io-parallel=off", "an expert's gate, up, down read one after another", env={"SDQ_IO_PARALLEL": "0"}),
    _x("direct=off", "exact expert reads through the page cache, no aligned O_DIRECT windows",
       env={"SDQ_DIRECT_IO": "0"}),
    *[_x(f"hot-pin={n}", "pin the N hottest experts of a baseline routing profile",
         env={"SDQ_HOT_PIN": str(n), "SDQ_PROFILE_IN": ROUTING_PROFILE}) for n in (32, 64)],
    *[_x(f"admit={k}", "admit a missed expert on its k-th lookup", env={"SDQ_ADMIT_MIN_HITS": str(k)})
      for k in (2, 3)],
    _x("uniform-slots", "every slot sized for the largest expert", env={"SDQ_FORCE_UNIFORM_SLOT": "1"}),
    _x("layer-ahead=0", "predict the current layer's experts (overlap its attention only)",
       env={"SDQ_PREFETCH_LAYER_AHEAD": "0"}),
    _x("layer-ahead=2", "predict two layers ahead", env={"SDQ_PREFETCH_LAYER_AHEAD": "2"}),
    _x("pf(queue=256,stale=1)", "deeper prefetch queue, shorter staleness",
       env={"SDQ_PREFETCH_QUEUE": "256", "SDQ_PREFETCH_STALE_TOKENS": "1"}),
    _x("pf(queue=16)", "shallow prefetch queue", env={"SDQ_PREFETCH_QUEUE": "16"}),
]
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in _CATALOG}

MATRICES: dict[str, list[str]] = {
    "quick": ["baseline", "threads=2", "prefetch=off", "fadvise=on", "arena=15%", "arena=35%",
              "batch=4", "batch=16", "hot-pin=64", "admit=2"],
    "io": ["baseline", "io-threads=1", "io-threads=2", "io-threads=8", "io-threads=16", "io-parallel=off",
           "direct=off", "fadvise=on"],
    "cache": ["baseline", "hot-pin=32", "hot-pin=64", "admit=2", "admit=3"],
    "slot": ["baseline", "uniform-slots"],
    "arena": ["baseline", "arena=15%", "arena=35%", "arena=50%"],
    "pf": ["baseline", "layer-ahead=0", "layer-ahead=2", "prefetch=off", "pf(queue=256,stale=1)", "pf(queue=16)"],
}


def select(suite: str, only: str | None = None) -> list[Experiment]:
    """The experiments of a matrix (`epmci bench --suite`, or `all`), deduplicated, filtered by
    --only substrings."""
    if suite != "all" and suite not in MATRICES:
        raise InputError("--suite", f"unknown suite {suite!r} (choose from {', '.join([*MATRICES, 'all'])})")
    names: list[str] = []
    for s in (list(MATRICES) if suite == "all" else [suite]):
        names += [n for n in MATRICES[s] if n not in names]
    if only:
        keys = [k.strip() for k in only.split(",") if k.strip()]
        names = [n for n in names if any(k in n for k in keys)]
        if not names:
            raise InputError("--only", f"no experiment of suite {suite} matches {only!r}")
    return [EXPERIMENTS[n] for n in names]
