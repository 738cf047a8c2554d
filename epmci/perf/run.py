"""The one scenario loop. What the perf suite compares and what `epmci golden update`
records are measured here, the same way:

1. a scenario whose experiment pins hot experiments first runs the baseline experiment on
   prompt 1 with --profile-out, and its runs read that routing profile;
2. every prompt of perf.prompts once, the timed first prompt last, so the other prompts'
   runs warm up (numba's cache files, the interpreter) for its first timed sample;
3. more timed runs of prompt 1 as asked (`timed_run` buys one more);
4. an engine with a MoE dump: every prompt once more, untimed, with SDQ_MOE_DUMP, for the
   routed experts of every row and layer (kept out of the timed and counted runs: the dump
   is I/O and memory of its own).

Every run is a perf.measure.measure() (page cache dropped first). A failed run raises
RunFailed naming which run it was.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..config.experiments import EXPERIMENTS
from ..contract.outputs import ContractError, read_routing
from ..contract.process import EngineCommand
from .measure import Measurement, measure
from .plan import PerfPlan

OnRun = Callable[[str, int, int, Measurement], None]   # (kind "prompt"|"timed", index, of, run)


class RunFailed(Exception):
    def __init__(self, what: str, m: Measurement):
        self.what, self.measurement = what, m
        super().__init__(f"{what}: {m.failure}")


def timing_order(n_prompts: int) -> list[int]:
    return list(range(1, n_prompts)) + [0]


@dataclass
class ScenarioRuns:
    first: list[Measurement] = field(default_factory=list)   # one per prompt, in prompt order
    timed: list[Measurement] = field(default_factory=list)   # prompt 1's timed runs, first[0] included
    routing: list[np.ndarray] | None = None   # per prompt, routed experts (n_layer, rows, k); None: no MoE dump
    routing_failure: str | None = None        # why a declared MoE dump gave no routing


class Scenario:
    def __init__(self, engine: EngineCommand, model: Path, plan: PerfPlan, name: str,
                 workdir: Callable[[str], Path], *, timeout: float, on_run: OnRun | None = None):
        self.engine, self.model, self.plan, self.name = engine, model, plan, name
        self.workdir, self.timeout = workdir, timeout
        self.on_run = on_run or (lambda kind, i, n, m: None)
        self.specs = plan.specs[name]
        self.runs = ScenarioRuns()

    def _measure(self, spec, where: str, label: str, keep_rows: int = 0) -> Measurement:
        return measure(self.engine, self.model, spec, self.workdir(f"perf-{self.name}-{where}"),
                       timeout=self.timeout, keep_rows=keep_rows, label=f"perf {self.name} {label}",
                       promises=self.plan.promises)

    def run(self, timed_repeats: int) -> ScenarioRuns:
        """Steps 1-3 of the module doc; `timed_repeats` counts the first run of prompt 1."""
        if EXPERIMENTS[self.name].needs_routing_profile:
            routing = self.workdir(f"perf-{self.name}") / "routing.profile"
            spec = self.plan.scenario_specs("baseline")[0]
            spec.profile_out = str(routing)
            m = self._measure(spec, "routing", "routing")
            if not m.ok:
                raise RunFailed("routing profile run", m)
            self.specs = self.plan.scenario_specs(self.name, str(routing))
        first: list[Measurement | None] = [None] * len(self.specs)
        for i in timing_order(len(self.specs)):
            m = self._measure(self.specs[i], f"p{i}", f"p{i + 1}", keep_rows=self.plan.cfg.perf.golden_rows)
            if not m.ok:
                raise RunFailed(f"prompt {i + 1} run", m)
            self.on_run("prompt", i, len(self.specs), m)
            first[i] = m
        self.runs = ScenarioRuns(first, [first[0]])
        while len(self.runs.timed) < timed_repeats:
            self.timed_run(timed_repeats)
        if self.engine.has("moe_dump"):
            self.routing_runs()
        return self.runs

    def routing_runs(self) -> None:
        """Step 4: every prompt's routing, or why there is none (a failed run or an unusable
        dump is the routing verdict's failure, not the scenario's)."""
        f, routing = self.plan.facts, []
        for i, spec in enumerate(self.specs):
            prefix = self.workdir(f"perf-{self.name}-moe-p{i}") / "moe"
            m = self._measure(dataclasses.replace(spec, env={**spec.env, "SDQ_MOE_DUMP": str(prefix)}),
                              f"moe-p{i}", f"p{i + 1} routing")
            if not m.ok:
                self.runs.routing_failure = f"the MoE-dump run of prompt {i + 1} failed: {m.failure}"
                return
            try:
                layers = read_routing(prefix, f.n_layer, f.n_embd, f.n_expert_used)
            except ContractError as e:
                self.runs.routing_failure = f"prompt {i + 1}: {e}"
                return
            finally:
                for p in prefix.parent.glob("moe.*"):
                    p.unlink()
            rows = min(len(x) for x in layers)
            routing.append(np.stack([x[:rows] for x in layers]))
        self.runs.routing = routing

    def timed_run(self, of: int = 0) -> Measurement:
        k = len(self.runs.timed)
        m = self._measure(self.specs[0], "timed", f"timed {k + 1}")
        if not m.ok:
            raise RunFailed(f"timed run {k + 1}", m)
        self.runs.timed.append(m)
        self.on_run("timed", k, of, m)
        return m
