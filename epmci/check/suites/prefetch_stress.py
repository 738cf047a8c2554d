"""Layer 3, prefetch-stress: prefetch on with a large queue, stale predictions dropped after
one token, layer-ahead prediction (as far as the model has layers: check/plan.py), and an
arena just above the minimum so experts are evicted as often as the routing allows; in both
slot layouts (mixed sizes, and SDQ_FORCE_UNIFORM_SLOT=1). The MoE dumps are checked against
the reference as in the layer suite, the predictions against the reference's router, and
every exact counter against the contract's cache policy replayed on the run's own routing
and predictions (check/cache_check.py; without a prefetch dump, the evictions against the
fewest any policy needs, Belady's MIN): a cache or queue fault fails on any model.

Catches what the demand path cannot: a prefetch into a slot of the wrong size (it overwrites
the neighbouring slot), a slot computed on before its read completed, a prefetched expert
evicted while in use, the uniform layout's slot accounting. Any `[epm] SLOT-ERROR` line
fails the run. Compared with the reference, not with a prefetch-off run, so the verdict does
not depend on any other run.
"""

from __future__ import annotations

from ...contract.outputs import ContractError, stats_total
from ...contract.runspec import STATS_FILE
from ...units import MiB
from ..context import CheckContext
from ..result import FAIL, PASS, CheckResult
from ..cache_check import CacheSetup, counter_problems, prefetch_env
from .base import Task, run_failed
from .layer import check_layers, dump_results, evaluated_rows

NAME = "prefetch-stress"


class PrefetchStressSuite:
    name = NAME
    title = "prefetch-stress: prefetch on, tiny arena, eviction every token, both slot layouts"
    description = __doc__
    requires = ("pager", "moe_dump")

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        layers = [l for l in check_layers(ctx) if 0 <= l < ctx.facts.n_layer]
        out = []
        for layout in ctx.cfg.prefetch_stress.layouts:
            names = {il: f"{layout} L{il}" for il in layers}
            run_name = f"{layout} run"
            out.append(Task(NAME, f"{layout}", lambda layout=layout, names=names, run_name=run_name:
                            self.check(ctx, layout, run_name, names),
                            names=[run_name, *names.values()], cost=2.0))
        return out

    def check(self, ctx: CheckContext, layout: str, run_name: str, names: dict[int, str]) -> list[CheckResult]:
        s = ctx.cfg.prefetch_stress
        uniform = layout == "uniform"
        out = ctx.dir(f"stress-{layout}")
        arena = ctx.stress_arena_mb(uniform)
        spec = ctx.spec(ctx.cfg.prompts.stress, n_predict=ctx.cfg.run.n_predict, batch=s.batch, arena_mb=arena)
        env = {"SDQ_MOE_DUMP": str(out / "moe"), "SDQ_PREFETCH": "1",
               "SDQ_PREFETCH_LAYER_AHEAD": str(ctx.plan.stress_layer_ahead), "SDQ_PREFETCH_QUEUE": str(s.queue),
               "SDQ_PREFETCH_STALE_TOKENS": str(s.stale_tokens),
               "SDQ_FORCE_UNIFORM_SLOT": "1" if uniform else "0", **prefetch_env(ctx, out)}
        run = ctx.run(f"prefetch-stress {layout}", spec, out, env=env)
        if not run.ok:
            return run_failed(NAME, [run_name, *names.values()], run)
        details = f"command: {run.command_line()}"
        props = {"layout": layout, "arena_mb": round(arena, 6), "batch": s.batch,
                 "min_arena_mb": round(ctx.facts.min_arena_bytes(s.batch, uniform) / MiB, 6)}
        problems = []
        if run.slot_errors:
            props["slot_errors"] = len(run.slot_errors)
            problems.append(f"engine reported {len(run.slot_errors)} slot error(s): {run.slot_errors[0]}")
        try:
            stats = ctx.stats(out / STATS_FILE)
            tokens = stats_total(stats, "tokens")
            for key in ("evictions", "prefetch_issued", "prefetch_used", "misses"):
                props[key] = stats_total(stats, key)
            props["n_slots"] = stats[0].get("n_slots")
            props["tokens"] = tokens
            problems += counter_problems(ctx, out, stats, CacheSetup.of(ctx, env, s.batch), props, text=spec.prompt)
            if props["prefetch_issued"] <= 0:
                problems.append("no prefetch was issued, so the prefetch path was not exercised")
        except ContractError as e:
            problems.append(f"output unusable: {e}")
        rows, err = evaluated_rows(out)
        if err:
            problems.append(f"logits unusable: {err}")
        head = CheckResult(NAME, run_name, FAIL if problems else PASS,
                           "; ".join(problems) if problems else
                           f"{layout} slots, arena {arena:.2f} MiB: {props.get('evictions')} evictions (at least "
                           f"{props.get('fewest_evictions')}), "
                           f"{props.get('prefetch_issued')} prefetches ({props.get('prefetch_used')} used), "
                           f"no slot error; counters checked against {props.get('counters_oracle')}", props, run.seconds, run.stderr_tail(), details)
        extra = {"layout": layout, "arena_mb": round(arena, 6)}
        return [head, *dump_results(ctx, NAME, names, run, out, rows, extra, first_gets_run=False)]


SUITE = PrefetchStressSuite()
