"""Layer 2, layer: a real multi-token prompt with SDQ_MOE_DUMP (demand paging, prefetch
off); for the first, middle and last layer and every layer whose expert size differs from a
neighbour's, the reference recomputes routing and output from the dumped input. One run on
the engine's default kernels and one on every kernel path it declares (kernel.paths; a path
this CPU cannot run is a SKIP), so a path the default does not take is checked in a real
forward too.

Catches what a single expert cannot: multi-token micro-batches, routing and its weights,
the weighted sum, and paging faults in the engine's real forward (a wrong offset for some
experts, a slot of the wrong size for the layers where the expert size changes).
"""

from __future__ import annotations

from ...contract.outputs import ContractError, read_logits
from ...contract.runspec import LOGITS_FILE
from ...gguf.facts import ModelFacts
from ..context import CheckContext
from ..moe_check import check_dump
from ..result import FAIL, CheckResult
from .base import Task, kernel_paths, path_refused, path_suffix, run_failed

NAME = "layer"


def auto_layers(facts: ModelFacts) -> list[int]:
    """The first, middle and last layer, every layer whose expert size differs from a
    neighbour's (both slot classes, and the edges between them), and a layer of every kind."""
    n = facts.n_layer
    layers = {0, n // 2, n - 1}
    eb = facts.expert_bytes
    for il in range(n):
        if (il > 0 and eb[il] != eb[il - 1]) or (il + 1 < n and eb[il] != eb[il + 1]):
            layers.add(il)
    for kind in dict.fromkeys(facts.kinds):   # every layer kind (qwen35moe: delta net, attention)
        if kind not in {facts.kinds[il] for il in layers}:
            layers.add(facts.kinds.index(kind))
    return sorted(layers)


def check_layers(ctx: CheckContext) -> list[int]:
    ls = ctx.cfg.layer.layers
    return auto_layers(ctx.facts) if isinstance(ls, str) else sorted(set(ls))


def dump_results(ctx: CheckContext, suite: str, names: dict[int, str], run, out, expect_rows: int | None,
                 extra_props: dict | None = None, first_gets_run: bool = True) -> list[CheckResult]:
    """One result per layer; the run's time is counted once (on the first), the comparison
    time on each, so a suite's total time adds up."""
    details = f"command: {run.command_line()}"
    extra = {**(extra_props or {}), "run_seconds": round(run.seconds, 3)}
    return [check_dump(ctx, suite, name, out / f"moe.{il}", il, ctx.cfg.layer.tolerance, expect_rows,
                       run.seconds if i == 0 and first_gets_run else 0.0, run.stderr_tail(), details, extra)
            for i, (il, name) in enumerate(names.items())]


def evaluated_rows(out) -> tuple[int | None, str | None]:
    """Positions the run evaluated, from its logits file (one row per position)."""
    try:
        return int(read_logits(out / LOGITS_FILE).shape[0]), None
    except ContractError as e:
        return None, str(e)


class LayerSuite:
    name = NAME
    title = "layer: whole MoE layers of a real prompt (MoE dump) vs the reference"
    description = __doc__
    requires = ("moe_dump",)

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        layers = check_layers(ctx)
        bad = [l for l in layers if not 0 <= l < ctx.facts.n_layer]
        if bad:
            return [CheckResult(NAME, f"L{l}", FAIL, f"layer.layers: layer {l} is not in the model "
                                f"({ctx.facts.n_layer} layers)") for l in bad]
        tasks = []
        for path in kernel_paths(ctx):          # the engine's default kernels, then each declared path
            names = {il: f"L{il}{path_suffix(path)}" for il in layers}
            tasks.append(Task(NAME, f"layer dump{path_suffix(path)}", lambda names=names, path=path:
                              self.check(ctx, names, path), names=list(names.values()), cost=1.5))
        return tasks

    def check(self, ctx: CheckContext, names: dict[int, str], path: str | None = None) -> list[CheckResult]:
        out = ctx.dir("layer" + (f"-{path}" if path else ""))
        spec = ctx.spec(ctx.cfg.prompts.layer, n_predict=ctx.cfg.run.n_predict, prefetch=False)
        spec.kernels = path
        env = {"SDQ_MOE_DUMP": str(out / "moe")}
        if ctx.engine.has("pager"):
            env["SDQ_PREFETCH"] = "0"
        run = ctx.run(f"layer{path_suffix(path)}", spec, out, env=env)
        refused = path_refused(NAME, list(names.values()), run, path, ctx)
        if refused:
            return refused
        if not run.ok:
            return run_failed(NAME, list(names.values()), run)
        rows, err = evaluated_rows(out)
        if err:
            return [CheckResult(NAME, n, FAIL, f"logits unusable: {err}", {}, run.seconds, run.stderr_tail())
                    for n in names.values()]
        results = dump_results(ctx, NAME, names, run, out, rows)
        if run.slot_errors:
            for r in results:
                r.status = FAIL
                r.message = f"engine reported a slot error: {run.slot_errors[0]}; " + r.message
        return results


SUITE = LayerSuite()
