"""The perf suite's comparison with the pull request's base (--perf-base REF): the engine of
a git ref built in a worktree and measured in the same run as the head -- paced (both
engines alive, decode steps interleaved, epmci.perf.paced; both at one reduced arena when
two do not fit the memory at the scenario's) or, when an engine does not take --pace-fds,
two do not fit the memory even at the minimum arena, or perf.base_mode says so, whole-run ABBA
(epmci.perf.abba); the verdict says which mode ran and why. Two results per scenario: decode
tok/s and the p99 inter-token latency (paced only)."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace

from ...compare.counters import io_diagnosis
from ...compare.stats import UNKNOWN, Comparison, cpu_diagnosis, latency_percentiles, p99_regressed
from ...contract.memory import min_arena_mib
from ...perf.abba import ABABResult, Side, Worktree, base_side, build_base, run_abab
from ...perf.paced import PacedResult, Unpaceable, paced_spec, run_paced
from ...perf.plan import PerfPlan
from ...perf.record import BUSY_WARN_PCT
from ..context import CheckContext
from ..result import ERROR, FAIL, PASS, SKIP, CheckResult

NAME = "perf"
INCONCLUSIVE_STATUS = {"skip": SKIP, "pass": PASS, "fail": FAIL}


def base_result_names(scen: str, ref: str) -> list[str]:
    return [f"{scen}: decode tok/s vs base {ref}", f"{scen}: p99 inter-token latency vs base {ref}"]


def comparison_props(c: Comparison) -> dict:
    return {"baseline": round(c.baseline, 4), "current": round(c.current, 4), "ratio": round(c.ratio, 4),
            "p_value": round(c.p_value, 5), "verdict": c.verdict, "ci_low": round(c.ci[0], 4),
            "ci_high": round(c.ci[1], 4)}


def versus_base(ctx: CheckContext, plan: PerfPlan, scen: str, names: list[str]) -> list[CheckResult]:
    """[tok/s verdict, p99 latency verdict] against the engine of the base ref."""
    pc = ctx.cfg.perf
    t0 = time.perf_counter()
    props: dict = {"base_ref": pc.base, "base_sha": plan.base_sha}
    timeout = max(ctx.cfg.engine.timeout_s, ctx.cfg.engine.build_timeout_s)
    spec = plan.specs[scen][0]
    try:
        with Worktree(plan.repo, plan.base_sha) as wt:
            base = base_side(wt, ctx.engine)
            ok, bmsg, brun = build_base(base, wt, ctx.engine, ctx.cfg.engine.build_cmd,
                                        ctx.cfg.engine.build_timeout_s)
            props["base_build"] = bmsg
            if not ok:
                return [CheckResult(NAME, n, ERROR, f"could not build the base engine at {plan.base_sha[:12]}: "
                                    f"{bmsg}", dict(props), time.perf_counter() - t0,
                                    brun.stderr_tail() if brun else "") for n in names]
            head = Side("head", ctx.engine, None, {})
            fallback = "perf.base_mode is abba"
            if pc.base_mode == "paced":
                try:
                    res = run_paced(head, base, ctx.model_path, paced_spec(spec, pc.base_warmup_steps, pc.base_steps),
                                    ctx.dir(f"perf-base-{scen}"), pairs=pc.base_pairs, max_pairs=pc.base_max_pairs,
                                    step_pairs=pc.base_more_pairs, warmup=pc.base_warmup_steps, alpha=pc.base_alpha,
                                    floor=pc.base_floor, min_effect=pc.base_min_effect, timeout=timeout,
                                    min_arena_mb=min_arena_mib(spec, ctx.facts))
                    return _paced_verdicts(ctx, plan, names, res, props)
                except Unpaceable as e:
                    fallback = str(e)
            res = run_abab(head, base, ctx.model_path, replace(spec, n_predict=pc.abba_n_predict),
                           ctx.dir(f"perf-base-{scen}-abba"), pairs=pc.abba_pairs, max_pairs=pc.abba_max_pairs,
                           alpha=pc.alpha, min_effect=pc.min_effect, test=pc.paired_test, timeout=timeout)
            return _abba_verdicts(ctx, plan, names, res, props, fallback)
    except RuntimeError as e:
        return [CheckResult(NAME, n, ERROR, str(e), dict(props), time.perf_counter() - t0) for n in names]


def _paced_verdicts(ctx, plan, names, res: PacedResult, props: dict) -> list[CheckResult]:
    pc = ctx.cfg.perf
    props.update(mode="paced", steps=pc.base_steps, warmup_steps=pc.base_warmup_steps, seed=res.seed,
                 alpha=pc.base_alpha, alpha_per_look=round(res.alpha, 6), min_effect=pc.base_min_effect,
                 floor=pc.base_floor, memory=res.memory)
    if res.reduced_arena:
        props["reduced_arena"] = res.reduced_arena
    if res.failure:
        run = res.failure.run
        return [CheckResult(NAME, n, FAIL, f"--perf-base (paced): {res.failure}", dict(props), res.seconds,
                            run.stderr_tail() if run else "", f"command: {run.command_line()}" if run else "")
                for n in names]
    c = res.comparison
    first = res.first
    same_out = first.base.fingerprint() == first.head.fingerprint()
    busy = [p.other_cpu_pct for p in res.pairs if p.other_cpu_pct is not None]
    props.update({**comparison_props(c), "pairs": res.n_pairs, "cpu_ratio": round(res.cpu_ratio, 4),
                  "pair_ratios": [round(math.exp(x), 4) for x in res.samples()],
                  "pair_cpu_ratios": [round(math.exp(x), 4) for x in res.samples("cpu")],
                  "started_first": "".join("A" if p.started_first == "base" else "B" for p in res.pairs),
                  "outputs_equal_base": same_out})
    if busy:
        props["other_cpu_pct_median"] = round(statistics.median(busy), 1)
    level = f"{1 - res.alpha:.2%}"
    what = (f"decode tok/s head {c.current:.2f} vs base {c.baseline:.2f} at {plan.base_sha[:12]} (paced: "
            f"{res.n_pairs} process pairs x {pc.base_steps} interleaved decode steps; head/base x{c.ratio:.3f}, "
            f"one-sided {level} bounds [{c.ci[0]:.3f}, {c.ci[1]:.3f}], t test p={c.p_value:.3g} vs "
            f"{res.alpha:.3g} per look, SAME within {pc.base_min_effect:.0%}, DIFFERENT past {pc.base_floor:.0%}; "
            f"CPU time x{res.cpu_ratio:.3f}): "
            f"{c.verdict}")
    if busy and statistics.median(busy) >= BUSY_WARN_PCT:
        what += f" -- other processes used a median {statistics.median(busy):.0f}% of the CPU meanwhile"
    if res.reduced_arena:
        what += f"; {res.reduced_arena}"
    if not same_out:
        what += "; note: head and base outputs differ"
    tok = _tok_s_result(ctx, names[0], c, what, props, res.seconds, first.base.stats, first.head.stats,
                        cpu_diagnosis(c.ratio, res.cpu_ratio))
    return [tok, _latency_result(ctx, plan, names[1], res)]


def _tok_s_result(ctx, name, c: Comparison, what: str, props: dict, secs: float, base_stats: dict,
                  head_stats: dict, extra: str = "") -> CheckResult:
    pc = ctx.cfg.perf
    if c.regressed:
        io, why = io_diagnosis(base_stats.get("decode", {}), head_stats.get("decode", {}))
        props["io_regression"] = io
        why += f"; {extra}" if extra else ""
        return CheckResult(NAME, name, FAIL, f"tok/s regressed against the base: {what}; {why}", props, secs)
    if c.verdict == UNKNOWN:
        return CheckResult(NAME, name, INCONCLUSIVE_STATUS[pc.inconclusive],
                           f"inconclusive after {c.n_current} pairs (the cap): {what}", props, secs)
    return CheckResult(NAME, name, PASS, what, props, secs)


def _latency_result(ctx, plan, name: str, res: PacedResult) -> CheckResult:
    """p50/p95/p99 of each side, and the verdict of compare.stats.p99_regressed at
    perf.p99_max_ratio and perf.base_alpha (it cannot fire on one slow step)."""
    pc = ctx.cfg.perf
    limit = pc.p99_max_ratio
    steps = {side: res.latencies(side) for side in ("base", "head")}
    lat = {side: latency_percentiles(x) for side, x in steps.items()}
    failed, ratio, tail = p99_regressed(steps["base"], steps["head"], limit, pc.base_alpha)
    props = {f"{side}_{q}_ms": round(1e3 * v, 3) for side, qs in lat.items() for q, v in qs.items()}
    props.update(p99_ratio=round(ratio, 4), p99_max_ratio=limit, steps_per_side=len(steps["head"]),
                 tail_steps_above_p98=tail.above, tail_head_above=tail.head_above,
                 tail_p_value=round(tail.p_value, 6), tail_alpha=pc.base_alpha)
    what = (f"inter-token latency p50/p95/p99 head {'/'.join(f'{1e3 * v:.1f}' for v in lat['head'].values())} ms "
            f"vs base {'/'.join(f'{1e3 * v:.1f}' for v in lat['base'].values())} ms at {plan.base_sha[:12]} "
            f"({len(steps['head'])} paced steps a side): p99 x{ratio:.3f}; {tail.head_above} of the {tail.above} "
            f"steps above the pooled p98 are the head's (tail test p={tail.p_value:.3g} vs {pc.base_alpha:g})")
    if failed:
        return CheckResult(NAME, name, FAIL, f"p99 latency regressed against the base: {what}, over the limit "
                                             f"x{limit:g} (perf.p99_max_ratio)", props)
    if ratio > limit:
        return CheckResult(NAME, name, PASS, f"{what}: p99 over x{limit:g}, but no heavier tail than the base's "
                                             f"(a few slow steps, not a regression)", props)
    return CheckResult(NAME, name, PASS, f"{what} <= x{limit:g}", props)


def _abba_verdicts(ctx, plan, names, res: ABABResult, props: dict, fallback: str) -> list[CheckResult]:
    pc = ctx.cfg.perf
    props.update(mode="abba", fallback=fallback, n_predict=pc.abba_n_predict, test=pc.paired_test)
    note = f"ABBA of whole runs ({fallback})"
    latency = CheckResult(NAME, names[1], SKIP, f"no per-step times to take latencies from: {note}",
                          {"verdict": "SKIPPED", "fallback": fallback})
    if res.failure:
        run = res.failed_run.run if res.failed_run else None
        return [CheckResult(NAME, names[0], FAIL, f"--perf-base ({note}): {res.failure}", props, res.seconds,
                            run.stderr_tail() if run else "", f"command: {run.command_line()}" if run else ""),
                latency]
    c = res.comparison
    props.update({**comparison_props(c), "pairs": res.pairs, "alpha_per_look": round(res.alpha, 5),
                  "base_samples": [round(x, 4) for x in res.base], "head_samples": [round(x, 4) for x in res.head],
                  "order": "".join("A" if o == "base" else "B" for o in res.order)})
    same_out = (res.base_first.fingerprint() == res.head_first.fingerprint())
    props["outputs_equal_base"] = same_out
    what = (f"decode tok/s head {c.current:.2f} vs base {c.baseline:.2f} at {plan.base_sha[:12]} "
            f"({note}: paired median ratio x{c.ratio:.3f}, 95% CI [{c.ci[0]:.3f}, {c.ci[1]:.3f}], "
            f"{'Wilcoxon signed-rank' if pc.paired_test == 'wilcoxon' else 'sign test'} "
            f"p={c.p_value:.3g} vs {res.alpha:.3g} per look, {res.pairs} ABBA pairs, {pc.abba_n_predict} tokens): "
            f"{c.verdict}")
    if not same_out:
        what += "; note: head and base outputs differ"
    return [_tok_s_result(ctx, names[0], c, what, props, res.seconds, res.base_first.stats,
                          res.head_first.stats), latency]
