"""Layer 8, budget: the RAM budget promise itself (docs/engine-contract.md, Paging: Budget).
A paged run reports what it needs (`ram_need_mb`); started with a budget below that, the
engine must refuse -- exit 2, one line naming the budget; started with a budget just above
it, it must run and its peak RSS must stay under the budget.

And memory does not grow with tokens: the same small-arena run decoding GROWTH_TOKENS more
tokens may peak higher by at most those tokens' KV-cache rows and logits rows (upper bounds
from the model's facts), the arena (slots first touched late) and NOISE_MIB -- measured:
the bundled engine's peak moves by under 0.3 MiB over 64 more tokens on 6 models.

Catches an engine that ignores --ram-budget-mb (it runs anyway), one whose estimate leaves
something out (its peak RSS passes a budget it accepted), a refusal that is not the
contract's one line, and a leak per token on any model, with or without golden.
"""

from __future__ import annotations

from ...contract.outputs import ContractError
from ...contract.runspec import STATS_FILE
from ...units import MiB, arena_mib
from ..context import CheckContext
from ..result import FAIL, PASS, CheckResult
from .base import Task, run_failed

NAME = "budget"
RESULTS = ("refuses a budget below its need", "runs within a budget just above its need",
           "memory does not grow with tokens")
BELOW = 0.9                       # the refused budget: this share of the need
ABOVE_PCT, ABOVE_MB = 0.02, 4.0   # the accepted budget: the need plus the larger of these
GROWTH_TOKENS = 64                # decoded tokens the longer run adds
NOISE_MIB = 16.0                  # allocator and interpreter noise allowed on top


def above(need_mb: float) -> float:
    return round(need_mb + max(ABOVE_PCT * need_mb, ABOVE_MB), 1)


class BudgetSuite:
    name = NAME
    title = "budget: a budget below the need is refused, one just above it is kept"
    description = __doc__
    requires = ("pager",)

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        return [Task(NAME, "budget", lambda: self.check(ctx), names=list(RESULTS), cost=2.0)]

    def _run(self, ctx: CheckContext, label: str, budget_mb: float | None):
        spec = ctx.spec(ctx.cfg.prompts.determinism, n_predict=2)
        spec.ram_budget_mb = budget_mb
        out = ctx.dir(f"budget-{label}")
        return ctx.run(f"budget {label}", spec, out), out

    def probe(self, ctx: CheckContext, label: str = "need") -> tuple[float | None, list[CheckResult]]:
        """The need a run without a budget reports; or the failures saying why there is none."""
        run, out = self._run(ctx, label, None)
        if not run.ok:
            return None, run_failed(NAME, list(RESULTS), run, "run without a budget: ")
        try:
            need = max(float(r.get("ram_need_mb", 0) or 0) for r in ctx.stats(out / STATS_FILE))
        except ContractError as e:
            return None, [CheckResult(NAME, n, FAIL, f"output unusable: {e}") for n in RESULTS]
        if need <= 0:
            return None, [CheckResult(NAME, n, FAIL, "the stats report no ram_need_mb (docs/engine-contract.md, "
                                                     "Stats): the budget promise cannot be checked") for n in RESULTS]
        return need, []

    def check(self, ctx: CheckContext) -> list[CheckResult]:
        need, failed = self.probe(ctx)
        if need is None:
            return failed
        return [self.below(ctx, need), self.just_above(ctx, need), self.growth(ctx)]

    def below(self, ctx: CheckContext, need: float) -> CheckResult:
        budget = round(BELOW * need, 1)
        run, _ = self._run(ctx, "below", budget)
        props = {"need_mb": need, "budget_mb": budget, "returncode": run.returncode}
        lines = [l for l in run.stderr.splitlines() if l.strip()]
        flag = f"--ram-budget-mb {budget:g}"

        def result(status, msg):
            return CheckResult(NAME, RESULTS[0], status, msg, props, run.seconds, run.stderr_tail(),
                               f"command: {run.command_line()}")

        if run.timed_out or run.launch_error:
            return result(FAIL, run.failure())
        if run.returncode == 0:
            return result(FAIL, f"the engine ran with {flag} MiB although it needs {need} MiB: it ignores the budget")
        if run.returncode != 2:
            return result(FAIL, f"with {flag} (below the need of {need} MiB) the engine must exit 2, "
                                f"not {run.failure()}")
        named = [l for l in lines if flag in l]
        if len(lines) != 1 or not named:
            return result(FAIL, f"the refusal must be one line on stderr naming {flag!r}; got {len(lines)} "
                                f"line(s): {(lines[-1] if lines else '')[:200]!r}")
        return result(PASS, f"{flag} refused (need {need} MiB): {lines[0][:200]}")

    def just_above(self, ctx: CheckContext, need: float) -> CheckResult:
        budget = above(need)
        run, out = self._run(ctx, "above", budget)
        props = {"need_mb": need, "budget_mb": budget}
        if run.returncode == 2 and not run.timed_out:
            # A need counts the RSS at the run's start, and file pages reclaimed under memory
            # pressure lower it for one run (203.2 -> 208.3 MiB on tiny beside a busy test
            # suite): refused, the need is asked again, and only a budget above that one too
            # must be kept -- an engine refusing above what it reports still fails.
            again, failed = self.probe(ctx, "need-again")
            if again is None:
                return failed[1]
            if above(again) > budget:
                props.update(need_first_mb=need, need_mb=again)
                need, budget = again, above(again)
                props["budget_mb"] = budget
                run, out = self._run(ctx, "above-again", budget)
        if not run.ok:
            return run_failed(NAME, [RESULTS[1]], run, f"with --ram-budget-mb {budget:g} (need {need} MiB): ")[0]
        try:
            peak = max(float(r.get("peak_rss_mb", 0) or 0) for r in ctx.stats(out / STATS_FILE))
        except ContractError as e:
            return CheckResult(NAME, RESULTS[1], FAIL, f"output unusable: {e}", props, run.seconds)
        props["peak_rss_mb"] = peak
        status = PASS if 0 < peak <= budget else FAIL
        what = (f"peak RSS {peak:.1f} MiB {'<=' if status == PASS else 'over'} the budget {budget:g} MiB "
                f"(need {need} MiB)")
        if peak <= 0:
            what = "the stats report no peak_rss_mb"
        return CheckResult(NAME, RESULTS[1], status, what, props, run.seconds, run.stderr_tail(),
                           f"command: {run.command_line()}")

    def growth(self, ctx: CheckContext) -> CheckResult:
        """Peak RSS of a run decoding GROWTH_TOKENS more than another, both in an arena a few
        slots above the minimum (so what the arena may add late stays small)."""
        arena = arena_mib(ctx.facts.min_arena_bytes(ctx.cfg.run.batch, False, ctx.cfg.run.margin_experts))
        runs = []
        for label, n in (("short", 2), ("long", 2 + GROWTH_TOKENS)):
            spec = ctx.spec(ctx.cfg.prompts.determinism, n_predict=n, arena_mb=arena)
            out = ctx.dir(f"budget-{label}")
            run = ctx.run(f"budget {label}", spec, out)
            if not run.ok:
                return run_failed(NAME, [RESULTS[2]], run, f"{label} run: ")[0]
            try:
                stats = ctx.stats(out / STATS_FILE)
            except ContractError as e:
                return CheckResult(NAME, RESULTS[2], FAIL, f"output unusable: {e}", {}, run.seconds)
            runs.append((run, spec, max(float(r.get("peak_rss_mb", 0) or 0) for r in stats),
                         sum(int(r.get("tokens", 0)) for r in stats if r["phase"] == "decode")))
        (short, spec, peak_a, tok_a), (long_, _, peak_b, tok_b) = runs
        hp = ctx.mf.hp
        per_token = 2 * hp.n_layer * hp.n_head_kv * hp.head_dim * 4 + (4 * hp.n_vocab if spec.dump_logits else 0)
        extra = max(0, tok_b - tok_a)
        allowed = extra * per_token / MiB + arena + NOISE_MIB
        grew = peak_b - peak_a
        props = {"peak_short_mb": peak_a, "peak_long_mb": peak_b, "extra_tokens": extra, "arena_mb": round(arena, 3),
                 "allowed_growth_mb": round(allowed, 2), "per_token_bytes_allowed": per_token}
        status = PASS if peak_a > 0 and grew <= allowed else FAIL
        what = (f"peak RSS {peak_a:.1f} MiB after {tok_a} decoded token(s), {peak_b:.1f} MiB after {tok_b}: "
                f"{grew:+.1f} MiB for {extra} more tokens, allowed {allowed:.1f} (their KV and logits rows, "
                f"the {arena:.1f} MiB arena, {NOISE_MIB:g} MiB)")
        if peak_a <= 0:
            what = "the stats report no peak_rss_mb"
        elif status == FAIL:
            what = f"memory grows with tokens: {what}; {grew / max(1, extra):.2f} MiB a token"
        return CheckResult(NAME, RESULTS[2], status, what, props, short.seconds + long_.seconds,
                           long_.stderr_tail(), f"command: {long_.command_line()}")


SUITE = BudgetSuite()
