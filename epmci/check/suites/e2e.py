"""Layer 5, end-to-end A/B: each prompt (single-token ones included) generated with the pager
and with --no-pager (experts read in place from the mapped file); the logits of every
position and the generated text are compared by CheckContext.logits_rule("itself"): byte-exact
for an engine that declares reference_exact, as the bundled one does (the two paths differ
only in where expert bytes come from), else e2e.compare (KL at most e2e.max_kl by default).

Catches wiring faults the other layers cannot see: a layer skipped or computed twice, a
wrong KV position across micro-batches, state leaking between tokens.
"""

from __future__ import annotations

import time

from ...compare.logits import compare_logits
from ...contract.outputs import ContractError, read_logits
from ...contract.runspec import LOGITS_FILE, STATS_FILE
from ..context import CheckContext
from ..result import FAIL, PASS, SKIP, CheckResult
from .base import Task, prompt_label, run_failed

NAME = "e2e"
# the suites that check the paged path, when the A/B does not run (--fast)
PAGED_PATH_SUITES = ("kernel", "layer", "prefetch-stress", "determinism", "switches")


class E2ESuite:
    name = NAME
    title = "e2e A/B: paged vs --no-pager, logits of every position"
    description = __doc__
    requires = ("pager",)       # the A/B's two sides: paged, and --no-pager

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        if ctx.cfg.fast:
            rest = [s for s in PAGED_PATH_SUITES if s in ctx.suites_run]
            rests = (f"equivalence rests on the {', '.join(rest)} layer{'s' * (len(rest) > 1)}" if rest else
                     "no other layer of this check runs the paged path against the reference")
            return [CheckResult(NAME, "e2e A/B", SKIP,
                                f"skipped by --fast ({len(ctx.cfg.prompts.e2e)} prompts paged vs --no-pager "
                                f"not run; {rests})", {"skipped_by": "--fast", "rests_on": rest})]
        return [Task(NAME, prompt_label(i, p), lambda i=i, p=p: [self.check(ctx, i, p)],
                     names=[prompt_label(i, p)], cost=2.0)
                for i, p in enumerate(ctx.cfg.prompts.e2e)]

    def check(self, ctx: CheckContext, i: int, prompt: str) -> CheckResult:
        name = prompt_label(i, prompt)
        n = ctx.cfg.e2e.n_predict
        da, db = ctx.dir(f"e2e-{i}-resident"), ctx.dir(f"e2e-{i}-paged")
        resident = ctx.run(f"e2e {i} --no-pager", ctx.spec(prompt, n_predict=n, pager=False), da)
        if not resident.ok:
            return run_failed(NAME, [name], resident, "--no-pager run: ")[0]
        paged = ctx.run(f"e2e {i} paged", ctx.spec(prompt, n_predict=n), db)
        if not paged.ok:
            return run_failed(NAME, [name], paged, "paged run: ")[0]
        t0 = time.perf_counter()
        rule = ctx.logits_rule("itself")
        secs = resident.seconds + paged.seconds
        details = f"--no-pager: {resident.command_line()}\npaged: {paged.command_line()}"
        props = {"mode": rule.mode, "prompt": prompt}
        if rule.mode == "kl":
            props["max_kl_allowed"] = rule.max_kl

        def result(status, msg):
            return CheckResult(NAME, name, status, msg, props, secs + time.perf_counter() - t0,
                               paged.stderr_tail(), details)

        try:
            la, lb = read_logits(da / LOGITS_FILE), read_logits(db / LOGITS_FILE)
            prefill = [r for r in ctx.stats(db / STATS_FILE) if r["phase"] == "prefill"]
            props["prompt_tokens"] = prefill[0].get("tokens") if prefill else None
        except ContractError as e:
            return result(FAIL, f"output unusable: {e}")
        if paged.slot_errors:
            return result(FAIL, f"engine reported a slot error: {paged.slot_errors[0]}")
        diff = compare_logits(la, lb)
        props.update(diff.props())
        same_text = resident.stdout == paged.stdout
        props["text_equal"] = same_text
        ok = diff.passes(rule)
        if diff.rows_a == 0:
            return result(FAIL, "empty comparison: no logits rows")
        if rule.mode == "exact" and not same_text:
            ok = False
        what = f"{props['prompt_tokens']}-token prompt, {diff.text()}, text {'equal' if same_text else 'differs'}"
        if ok:
            return result(PASS, f"{rule.text()}: {what}")
        return result(FAIL, f"paged differs from --no-pager ({rule.text()}): {what}")


SUITE = E2ESuite()
