"""Layer 4, determinism: the same prompt run twice with the model's page cache dropped in
between (posix_fadvise DONTNEED, so the second run reads from disk), and once with each other
thread count of the plan (1, 2, 3 and the runner's CPUs: check/plan.py). Logits must be byte-identical, generated text equal and every exact counter of
the stats (hits, misses, evictions, bytes read, prefetch counts, ...) identical. The first
run, on the engine's default paging settings and arena, is also replayed on the contract's
cache policy (check/cache_check.py): every exact counter as the policy gives it.

Catches: accumulation whose order depends on the thread count, results that depend on I/O
timing (a slot used before its read completed shows up when reads get slow), counters
that race.
"""

from __future__ import annotations

import time

from ...compare.counters import counter_changes, n_counters
from ...compare.logits import compare_logits
from ...contract.outputs import ContractError, counters_of, read_logits
from ...contract.process import drop_page_cache
from ...contract.runspec import LOGITS_FILE, STATS_FILE
from ..context import CheckContext
from ..cache_check import CacheSetup, counter_problems, prefetch_env
from ..result import FAIL, PASS, SKIP, CheckResult
from .base import Task, run_failed

NAME = "determinism"
REPLAYED = "default settings: counters replayed"


class DeterminismSuite:
    name = NAME
    title = "determinism: page cache dropped, other thread count: identical logits and counters"
    description = __doc__
    requires: tuple[str, ...] = ()

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        names = ["page cache dropped", *(f"threads {ctx.threads} vs {t}" for t in ctx.plan.other_threads), REPLAYED]
        return [Task(NAME, "determinism", lambda: self.check(ctx, names), names=names,
                     cost=2.0 + len(ctx.plan.other_threads))]

    def check(self, ctx: CheckContext, names: list[str]) -> list[CheckResult]:
        prompt, n = ctx.cfg.prompts.determinism, ctx.cfg.run.n_predict
        first_dir = ctx.dir("determinism-first")
        replay = ctx.engine.has("pager") and ctx.engine.has("moe_dump")
        env = {"SDQ_MOE_DUMP": str(first_dir / "moe"), **prefetch_env(ctx, first_dir)} if replay else {}
        first = ctx.run("determinism first", ctx.spec(prompt, n_predict=n), first_dir, env=env)
        if not first.ok:
            return run_failed(NAME, names, first, "first run: ")
        dropped = drop_page_cache(ctx.model_path)
        seconds = [(names[0], "cold", None, "after the page cache was dropped", {"page_cache_dropped": dropped})]
        seconds += [(name, f"threads-{t}", t, f"with -t {t}", {"threads": ctx.threads, "threads_other": t})
                    for name, t in zip(names[1:-1], ctx.plan.other_threads)]
        results = []
        for name, key, threads, what, props in seconds:
            out = ctx.dir(f"determinism-{key}")
            run = ctx.run(f"determinism {key}", ctx.spec(prompt, n_predict=n, threads=threads), out)
            if not run.ok:
                results += run_failed(NAME, [name], run, f"run {what}: ")
                continue
            results.append(self.compare(ctx, name, first, run, first_dir, out, what, not results, props))
        return results + [self.replayed(ctx, first, first_dir, replay)]

    @staticmethod
    def replayed(ctx: CheckContext, run, out, replay: bool) -> CheckResult:
        """The first run -- the engine's default paging settings and arena -- replayed on the
        contract's cache policy (check/cache_check.py)."""
        if not replay:
            return CheckResult(NAME, REPLAYED, SKIP, f"engine lacks {'pager' if not ctx.engine.has('pager') else 'moe_dump'}"
                               f": no routing to replay", {"skipped_by": "engine"})
        t0 = time.perf_counter()
        props: dict = {}
        try:
            stats = ctx.stats(out / STATS_FILE)
            problems = counter_problems(ctx, out, stats, CacheSetup.of(ctx, {}, ctx.cfg.run.batch), props,
                                        text=ctx.cfg.prompts.determinism)
        except ContractError as e:
            problems = [f"output unusable: {e}"]
        secs = time.perf_counter() - t0
        if problems:
            return CheckResult(NAME, REPLAYED, FAIL, "; ".join(problems), props, secs, run.stderr_tail())
        return CheckResult(NAME, REPLAYED, PASS, f"the default settings' counters checked against "
                                                 f"{props['counters_oracle']}", props, secs)

    def compare(self, ctx, name, a, b, da, db, what, count_first, props) -> CheckResult:
        t0 = time.perf_counter()
        secs = (a.seconds if count_first else 0.0) + b.seconds
        tail = b.stderr_tail()
        details = f"first: {a.command_line()}\nsecond: {b.command_line()}"
        try:
            la, lb = read_logits(da / LOGITS_FILE), read_logits(db / LOGITS_FILE)
            ca, cb = counters_of(ctx.stats(da / STATS_FILE)), counters_of(ctx.stats(db / STATS_FILE))
        except ContractError as e:
            return CheckResult(NAME, name, FAIL, f"output unusable: {e}", props, secs, tail, details)
        diff = compare_logits(la, lb)
        props = {**props, **diff.props(), "counters": n_counters(ca)}
        problems = []
        if la.shape[0] == 0:
            problems.append("no logits to compare")
        if not diff.identical:
            problems.append(f"logits not byte-identical {what}: {diff.text()}")
        if a.stdout != b.stdout:
            problems.append(f"generated text differs {what}")
        cd = [c.text("vs") for c in counter_changes(ca, cb)]
        if not n_counters(ca):
            problems.append("stats have no counters to compare")
        if cd:
            props["counters_differ"] = cd
            problems.append(f"counters differ {what}: {'; '.join(cd[:4])}")
        secs += time.perf_counter() - t0
        if problems:
            return CheckResult(NAME, name, FAIL, "; ".join(problems), props, secs, tail, details)
        pagerless = "" if ctx.engine.has("pager") else " (the engine has no pager: no paging counters)"
        return CheckResult(NAME, name, PASS, f"{diff.text()}, text equal, {n_counters(ca)} counters identical "
                           f"{what}{pagerless}", props, secs, tail, details)


SUITE = DeterminismSuite()
