"""Perf and drift: exact counters, correctness fingerprints, tok/s and peak RSS against the
golden baseline of the runner profile (golden/<profile>/<model id>.yaml), and with
--perf-base REF tok/s against the engine of a git ref measured in the same run.

Per scenario (perf.scenarios, experiments of epmci/config/experiments.py), every prompt of perf.prompts
is run once with the model's page cache dropped; the first prompt is also the timed one
(perf.repeats runs, an UNKNOWN verdict buys more up to perf.max_repeats; --fast, with or without
--perf-base, times nothing against golden), run after the other prompts, which warm up for it. Timed runs are
exclusive: they start after every other check finished and run one at a time (with
--no-timing nothing is timed and the scenario runs alongside the other checks).

- counters: every exact stats counter of every prompt and phase equals golden. A worse one
  (more misses, evictions, bytes; fewer hits, used prefetches) or a change with no
  direction (slots, tokens) fails; a better one passes with a note to refresh golden.
- fingerprint: generated tokens, logits digest and text digest equal golden; on a mismatch
  the KL divergence and top-1 agreement against the golden logits rows say how far it
  drifted.
- routing (an engine with a MoE dump): every prompt's routed expert set at every row and
  layer equals golden's; a change names the first layer where routing moved and how many
  positions agree per layer (epmci.compare.routing) -- where a drift starts, even when the
  generated text is the same.
- decode tok/s vs golden: Mann-Whitney U on the samples plus a minimum effect size:
  SAME / DIFFERENT / UNKNOWN. Skipped (not passed) with --no-timing, without a timing
  baseline, or on a machine whose fingerprint differs from the one golden was recorded on.
  A drop is set against the machine's own speed (epmci.perf.speed, recorded with golden):
  when this machine's CPU and disk, weighted by golden's read-wait share, explain it within
  the min effect, it is inconclusive (perf.inconclusive), not a regression.
- peak RSS: under perf.ram_budget_mb (every perf run is also started with that budget).
- decode tok/s vs base (--perf-base): both engines alive at once, their decode steps
  interleaved (epmci.perf.paced; a one-sided t test on the process pairs' robust per-step
  log-ratios, CPU time beside it); whole-run ABBA of perf.abba_n_predict tokens instead
  (epmci.perf.abba) when an engine does not take --pace-fds, two engines do not fit the
  memory even at one reduced arena each (they run paced there when they do), or
  perf.base_mode is abba -- the verdict says which and why.
- p99 inter-token latency vs base (--perf-base, paced only): p50/p95/p99 of each side's
  paced step times; fails above perf.p99_max_ratio times the base's.

No golden file for the profile and model: those checks are skipped with the command that
records one.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from ...compare.counters import counter_changes, io_diagnosis, n_counters
from ...compare.logits import drift
from ...compare.routing import routing_agreement
from ...compare.stats import DIFFERENT, SAME, UNKNOWN, compare_samples, per_look_alpha
from ...config.experiments import EXPERIMENTS
from ...perf.machine import mismatches
from ...perf.speed import explains, machine_speed
from ...perf.measure import Measurement, unstable
from ...perf.plan import PerfPlan, prepare
from ...perf.record import BUSY_WARN_PCT
from ...perf.run import RunFailed, Scenario
from ..capabilities import lacks
from ..context import CheckContext
from ..result import FAIL, PASS, SKIP, CheckResult
from .base import Task, prompt_label, run_failed
from .perf_base import INCONCLUSIVE_STATUS, NAME, base_result_names, comparison_props, versus_base

# settings that decide counters and fingerprints (threads and the RAM budget do not)
COUNTER_SETTINGS = ("prompts", "n_predict", "batch", "ctx")


@dataclass(frozen=True)
class Evidence:
    """One scenario's runs and what its golden entry holds: what every golden verdict reads."""
    plan: PerfPlan
    scen: str
    golden: dict | None            # the scenario's golden entry; None: nothing to compare with...
    why: str | None                # ...and why
    first: list[Measurement]       # one run per prompt
    timed: list[Measurement]       # prompt 1's timed runs (the first of them included)
    routing: list | None = None    # per prompt, routed experts (n_layer, rows, k); None: no MoE dump
    routing_failure: str | None = None


def result_names(ctx: CheckContext, scen: str) -> list[str]:
    names = [f"{scen}: counters"]
    names += [f"{scen}: fingerprint {prompt_label(i, p, 'p')}" for i, p in enumerate(ctx.cfg.perf.prompts)]
    names.append(f"{scen}: routing")
    names += [f"{scen}: decode tok/s vs golden", f"{scen}: peak RSS"]
    return names


CI_VARIABLES = ("CI", "GITHUB_ACTIONS")


def in_ci(env=None) -> bool:
    env = os.environ if env is None else env
    return any(env.get(v, "").strip().lower() not in ("", "0", "false") for v in CI_VARIABLES)


def missing_baseline_status(cfg) -> str:
    """No golden baseline to compare with: a failure in CI (a pull request that changes the
    model identity must not switch the drift gate off), a visible skip elsewhere;
    perf.missing_baseline fail | skip says so explicitly."""
    rule = cfg.perf.missing_baseline
    return FAIL if rule == "fail" or (rule == "auto" and in_ci()) else SKIP


class PerfSuite:
    name = NAME
    title = "perf: counters, fingerprints, tok/s and peak RSS vs golden; --perf-base A/B"
    description = __doc__
    requires: tuple[str, ...] = ()
    together = ("base and head are timed on the same runner, and golden timing and RSS are keyed to the "
                "runner's profile")

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        plan = prepare(ctx.cfg, ctx.model_path, ctx.facts, ctx.caps.identity(ctx.engine))
        pc = ctx.cfg.perf
        items: list[Task | CheckResult] = []
        too_big = self._budget_too_big(ctx)
        for scen in pc.scenarios:
            missing = ctx.caps.lacking(EXPERIMENTS[scen].requires)
            if missing:
                items.append(lacks(NAME, scen, missing, ctx.caps))
                continue
            names = result_names(ctx, scen)
            if too_big:
                names += base_result_names(scen, pc.base) if pc.base else []
                items += [CheckResult(NAME, n, FAIL, too_big, {"budget_mb": pc.ram_budget_mb}) for n in names]
                continue
            timed = pc.timing and self._timing_skip(ctx, plan, scen) is None
            runs = len(pc.prompts) + (plan.repeats - 1 if timed else 0)
            items.append(Task(NAME, scen, lambda s=scen: self.scenario(ctx, plan, s), names=names,
                              cost=float(runs), exclusive=timed))
            if pc.base:
                bnames = base_result_names(scen, pc.base)
                if not pc.timing:
                    items += [CheckResult(NAME, n, SKIP, "timing comparisons skipped (--no-timing): --perf-base not run",
                                          {"verdict": "SKIPPED"}) for n in bnames]
                else:
                    items.append(Task(NAME, bnames[0], lambda s=scen, n=bnames: versus_base(ctx, plan, s, n),
                                      names=bnames, cost=2.0 * pc.base_pairs, exclusive=True))
        return items

    @staticmethod
    def _budget_too_big(ctx: CheckContext) -> str | None:
        """A perf run may grow to its --ram-budget-mb; one whose budget is more than the
        memory the check leaves for engine runs is killed by the kernel minutes later (8192
        in an 8 GiB runner, where epmci holds ~2 GiB): refused up front, with the numbers."""
        cap, budget = ctx.memory.capacity, ctx.cfg.perf.ram_budget_mb
        if cap is None or budget <= cap:
            return None
        return (f"perf.ram_budget_mb {budget:g} MiB is more than the memory this check leaves for an engine run "
                f"({cap:.0f} MiB, run.memory_mb {ctx.cfg.run.memory_mb}): the runs would be killed; "
                f"set perf.ram_budget_mb <= {cap:.0f} or give the check more memory")

    # -------------------------------------------------------------- golden side

    def _golden_scenario(self, plan: PerfPlan, scen: str) -> tuple[dict | None, str | None]:
        """(golden scenario, None) or (None, why there is nothing to compare with)."""
        if plan.golden is None:
            why = (f"no golden baseline for profile {plan.profile!r} and model {plan.model_id['id']} "
                   f"({plan.golden_file} does not exist): record one with `{plan.record_hint()}`")
        elif plan.golden.foreign(plan.engine):
            why = (f"{plan.golden.foreign(plan.engine)} -- record this engine's own under another profile: "
                   f"`{plan.record_hint(other_profile=True)}`")
        elif plan.golden.scenario(scen) is None:
            why = f"golden {plan.golden_file.name} has no scenario {scen!r}: record it with `{plan.record_hint()}`"
        else:
            return plan.golden.scenario(scen), None
        if missing_baseline_status(plan.cfg) == FAIL:
            why += (" -- a failure " + ("in CI (CI or GITHUB_ACTIONS is set)" if plan.cfg.perf.missing_baseline == "auto"
                                        else "(perf.missing_baseline: fail)")
                    + "; --allow-missing-baseline makes it a skip")
        return None, why

    def _settings_problem(self, plan: PerfPlan, scen: str, keys) -> str | None:
        gs = plan.golden.settings
        diff = [f"{k} {gs.get(k)!r} (golden) vs {plan.settings.get(k)!r}" for k in keys
                if gs.get(k) != plan.settings.get(k)]
        g = plan.golden.scenario(scen)
        cur = plan.specs[scen][0]
        if g.get("arena_mb") is None or abs(g["arena_mb"] - (cur.arena_mb or 0)) > 1e-5:
            diff.append(f"arena_mb {g.get('arena_mb')!r} (golden) vs {cur.arena_mb!r}")
        for k, want in (("env", EXPERIMENTS[scen].env), ("prefetch", cur.prefetch)):
            if g.get(k, want) != want:
                diff.append(f"{k} {g.get(k)!r} (golden) vs {want!r}")
        if diff:
            return ("golden was recorded with other settings: " + "; ".join(diff)
                    + f" -- restore them or re-record: `{plan.record_hint()}`")
        return None

    def _timing_skip(self, ctx: CheckContext, plan: PerfPlan, scen: str) -> str | None:
        if not ctx.cfg.perf.timing:
            return "timing comparison skipped (--no-timing)"
        if ctx.cfg.fast:
            # A quick gate: a few unpaired runs on a busy machine produced false alarms (x0.43
            # under a concurrent test suite). One rule, with or without --perf-base: --fast
            # times nothing against golden; --perf-base is the paired timing verdict.
            return ("timing comparison against golden skipped by --fast (run without --fast on the profile's "
                    "machine; --perf-base REF gives the paired verdict)")
        g, why = self._golden_scenario(plan, scen)
        if g is None:
            return why
        if not g.get("timing"):
            return (f"golden for profile {plan.profile!r} has no timing baseline (recorded with --no-timing): "
                    f"record one on the profile's machine with `{plan.record_hint()}`")
        if not plan.golden.machine:
            return f"golden for profile {plan.profile!r} has no machine fingerprint: tok/s not compared"
        mm = mismatches(plan.golden.machine, plan.machine)
        if mm:
            return (f"this machine does not match profile {plan.profile!r} ({'; '.join(mm)}): tok/s not compared "
                    f"with golden (use --profile for this machine's baselines, or --perf-base)")
        prob = self._settings_problem(plan, scen, COUNTER_SETTINGS + ("threads", "ram_budget_mb"))
        if prob:
            return prob
        return None

    # -------------------------------------------------------------- one scenario

    def scenario(self, ctx: CheckContext, plan: PerfPlan, scen: str) -> list[CheckResult]:
        names = result_names(ctx, scen)
        t0 = time.perf_counter()
        timing_skip = self._timing_skip(ctx, plan, scen)
        sc = Scenario(ctx.engine, ctx.model_path, plan, scen, ctx.dir, timeout=ctx.cfg.engine.timeout_s)
        try:
            runs = sc.run(plan.repeats if timing_skip is None else 1)
        except RunFailed as e:
            return run_failed(NAME, names, e.measurement.run, f"{e.what}: ", e.measurement.failure)
        ev = Evidence(plan, scen, *self._golden_scenario(plan, scen), runs.first, runs.timed, runs.routing,
                      runs.routing_failure)
        out = [self.counters(ev, names[0])]
        out += [self.fingerprint(ev, names[1 + i], i) for i in range(len(ev.first))]
        out.append(self.routing(ctx, ev, names[-3]))
        out.append(self.timing(ctx, ev, names[-2], timing_skip, sc))
        out.append(self.rss(ctx, ev, names[-1]))
        out[0].seconds = time.perf_counter() - t0     # the scenario's runs, reported once
        return out

    # -------------------------------------------------------------- verdicts

    def counters(self, ev: Evidence, name: str) -> CheckResult:
        plan, scen, g, first = ev.plan, ev.scen, ev.golden, ev.first
        props: dict = {"prompts": len(first)}
        bad = unstable(ev.timed)
        d0 = first[0].counters.get("decode", {})
        props.update({f"decode_{k}": d0.get(k) for k in ("hits", "misses", "evictions", "ssd_bytes_per_token",
                                                          "prefetch_issued", "prefetch_used")})
        if bad:
            props["unstable_runs"] = bad
            return CheckResult(NAME, name, FAIL, f"counters or logits not reproducible: timed run(s) {bad} of "
                                                 f"prompt 1 differ from its first run", props)
        if g is None:
            return CheckResult(NAME, name, missing_baseline_status(plan.cfg), ev.why, props)
        prob = self._settings_problem(plan, scen, COUNTER_SETTINGS)
        if prob:
            return CheckResult(NAME, name, FAIL, prob, props)
        changes = []
        for i, m in enumerate(first):
            for ch in counter_changes(g["prompts"][i]["counters"], m.counters):
                changes.append((i, ch))
        worse = [f"p{i + 1} {c.text()}" for i, c in changes if c.kind == "worse"]
        better = [f"p{i + 1} {c.text()}" for i, c in changes if c.kind == "better"]
        changed = [f"p{i + 1} {c.text()}" for i, c in changes if c.kind == "changed"]
        gd = g["prompts"][0]["counters"].get("decode", {})
        props.update({f"golden_decode_{k}": gd.get(k) for k in ("hits", "misses", "evictions", "ssd_bytes_per_token")})
        props.update(worse=worse, better=better, changed=changed)
        n = sum(n_counters(m.counters) for m in first)
        if worse or changed:
            parts = []
            if worse:
                parts.append("worse than golden: " + "; ".join(worse[:6]))
            if changed:
                parts.append("changed: " + "; ".join(changed[:6]))
            if better:
                parts.append("better: " + "; ".join(better[:4]))
            return CheckResult(NAME, name, FAIL, "counters " + " | ".join(parts), props)
        if better:
            return CheckResult(NAME, name, PASS, "counters better than golden (passes; refresh golden with `"
                               + plan.record_hint() + "`): " + "; ".join(better[:6]), props)
        return CheckResult(NAME, name, PASS, f"{n} counters of {len(first)} prompts equal golden (decode: "
                           f"{d0.get('hits')} hits, {d0.get('misses')} misses, {d0.get('evictions')} evictions, "
                           f"{d0.get('ssd_bytes_per_token', 0) / 2**20:.3f} MiB/token)", props)

    def routing(self, ctx: CheckContext, ev: Evidence, name: str) -> CheckResult:
        plan, scen, g = ev.plan, ev.scen, ev.golden
        if not ctx.engine.has("moe_dump"):
            return CheckResult(NAME, name, SKIP, "the engine does not declare moe_dump: its routing is not "
                                                 "compared with golden")
        if ev.routing_failure:
            return CheckResult(NAME, name, FAIL, ev.routing_failure)
        if g is None:
            return CheckResult(NAME, name, missing_baseline_status(plan.cfg), ev.why)
        prob = self._settings_problem(plan, scen, COUNTER_SETTINGS)
        if prob:
            return CheckResult(NAME, name, FAIL, prob)
        missing = [i + 1 for i in range(len(ev.routing)) if plan.golden.routes(scen, i) is None]
        if missing:
            return CheckResult(NAME, name, SKIP, f"golden {plan.golden_file.name} has no routing for prompt(s) "
                                                 f"{missing} (recorded before routing was): re-record with "
                                                 f"`{plan.record_hint()}`")
        agree = [routing_agreement(list(r), list(plan.golden.routes(scen, i)), other="golden")
                 for i, r in enumerate(ev.routing)]
        props: dict = {"prompts": len(agree)}
        for i, a in enumerate(agree):
            props.update({f"p{i + 1}_{k}": v for k, v in a.props().items()})
        moved = [f"p{i + 1}: {a.text()}" for i, a in enumerate(agree) if not a.same]
        if moved:
            return CheckResult(NAME, name, FAIL, "routing moved from golden -- " + "; ".join(moved), props)
        return CheckResult(NAME, name, PASS, f"routing of {len(agree)} prompts equals golden on every layer "
                           f"({', '.join(str(a.positions) for a in agree)} positions)", props)

    def fingerprint(self, ev: Evidence, name: str, i: int) -> CheckResult:
        plan, scen, g, m = ev.plan, ev.scen, ev.golden, ev.first[i]
        fp = m.fingerprint()
        props = {"prompt_tokens": m.prompt_tokens, "generated": len(m.first_tokens), "logits_rows": m.logits_rows,
                 "logits_sha256": m.logits_sha256}
        if g is None:
            return CheckResult(NAME, name, missing_baseline_status(plan.cfg), ev.why, props)
        prob = self._settings_problem(plan, scen, COUNTER_SETTINGS)
        if prob:
            return CheckResult(NAME, name, FAIL, prob, props)
        ge = g["prompts"][i]
        props["golden_logits_sha256"] = ge["logits_sha256"]
        tok_eq = ge["first_tokens"] == fp["first_tokens"]
        same = (tok_eq and ge["logits_sha256"] == fp["logits_sha256"] and ge["text_sha256"] == fp["text_sha256"]
                and ge["logits_rows"] == fp["logits_rows"] and ge["prompt_tokens"] == fp["prompt_tokens"])
        if same:
            return CheckResult(NAME, name, PASS, f"{len(m.first_tokens)} generated tokens, text and logits "
                               f"({m.logits_rows} rows, sha256 {m.logits_sha256[:12]}) equal golden", props)
        parts = []
        if ge["prompt_tokens"] != fp["prompt_tokens"]:
            parts.append(f"prompt tokenized to {fp['prompt_tokens']} tokens, golden {ge['prompt_tokens']}")
        if tok_eq:
            parts.append(f"generated tokens equal ({len(m.first_tokens)})")
        else:
            a, b = ge["first_tokens"], fp["first_tokens"]
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            parts.append(f"generated tokens differ from position {k} ({a[k:k + 3]} golden vs {b[k:k + 3]})")
        if ge["logits_sha256"] != fp["logits_sha256"]:
            parts.append(f"logits sha256 {fp['logits_sha256'][:12]} != golden {ge['logits_sha256'][:12]}")
        if ge["text_sha256"] != fp["text_sha256"]:
            parts.append("generated text differs")
        rows = plan.golden.rows(scen, i)
        if rows is not None and m.gen_rows is not None:
            d = drift(rows, m.gen_rows)
            props.update(d.drift_props())
            parts.append(d.drift_text())
        else:
            parts.append("no golden logits rows to measure the drift")
        if plan.golden.machine and mismatches(plan.golden.machine, plan.machine):
            parts.append("note: this machine differs from the profile's, and float results of numpy/libm may "
                         "differ between CPUs")
        return CheckResult(NAME, name, FAIL, "output drifted from golden: " + "; ".join(parts), props)

    def timing(self, ctx: CheckContext, ev: Evidence, name: str, skip: str | None, sc: Scenario) -> CheckResult:
        pc, plan, g = ctx.cfg.perf, ev.plan, ev.golden
        timed = sc.runs.timed
        props: dict = {"verdict": "SKIPPED"}
        if skip is not None:
            if timed:   # measured all the same: the history (epmci history) keeps them
                props.update(current=timed[0].tok_s, samples=[round(m.tok_s, 4) for m in timed])
            return CheckResult(NAME, name, SKIP, skip, props)
        base = [float(x) for x in g["timing"]["samples"]]
        cur = [m.tok_s for m in timed]
        alpha = per_look_alpha(pc.alpha, len(cur), pc.max_repeats)
        comp = compare_samples(base, cur, alpha, pc.min_effect)
        while comp.verdict == UNKNOWN and len(cur) < pc.max_repeats:
            for _ in range(min(2, pc.max_repeats - len(cur))):
                try:
                    m = sc.timed_run()
                except RunFailed as e:
                    return run_failed(NAME, [name], e.measurement.run, "extra timed run: ", e.measurement.failure)[0]
                cur.append(m.tok_s)
            comp = compare_samples(base, cur, alpha, pc.min_effect)
        props = {**comparison_props(comp), "n_baseline": comp.n_baseline, "n_current": comp.n_current,
                 "samples": [round(x, 4) for x in cur], "alpha": pc.alpha, "alpha_per_look": round(alpha, 5),
                 "min_effect": pc.min_effect}
        busy = [m.other_cpu_pct for m in timed if m.other_cpu_pct is not None]
        if busy:
            props["other_cpu_pct_median"] = round(statistics.median(busy), 1)
        if plan.golden.recorded.get("other_cpu_pct_max") is not None:
            props["golden_other_cpu_pct_max"] = plan.golden.recorded["other_cpu_pct_max"]
        what = (f"decode tok/s {comp.current:.2f} vs golden {comp.baseline:.2f} (x{comp.ratio:.3f}, 95% CI "
                f"[{comp.ci[0]:.3f}, {comp.ci[1]:.3f}], Mann-Whitney p={comp.p_value:.3g}, {comp.n_current} vs "
                f"{comp.n_baseline} runs, min effect {pc.min_effect:.0%}): {comp.verdict}")
        if busy and statistics.median(busy) >= BUSY_WARN_PCT:
            what += (f" -- other processes used a median {statistics.median(busy):.0f}% of the CPU during "
                     f"these runs, so the machine, not only the engine, was measured")
        if comp.regressed:
            io, why = io_diagnosis(g["prompts"][0]["counters"].get("decode", {}), timed[0].stats.get("decode", {}))
            props["io_regression"] = io
            machine = self.machine_slowdown(ctx, g["timing"], comp.ratio, props)
            if props.get("machine_explains"):
                return CheckResult(NAME, name, INCONCLUSIVE_STATUS[pc.inconclusive],
                                   f"tok/s below golden, but the machine is slower than when golden was timed: "
                                   f"{what}; {machine}, which explains the drop within min effect: inconclusive "
                                   f"-- the base in the same run (--perf-base REF) decides, or re-record golden "
                                   f"on this machine as it is now", props)
            return CheckResult(NAME, name, FAIL, f"tok/s regressed: {what}; {why}; {machine}", props)
        if comp.verdict == DIFFERENT:
            return CheckResult(NAME, name, PASS, f"faster than golden: {what} (refresh golden with "
                                                 f"`{plan.record_hint()}`)", props)
        if comp.verdict == SAME:
            return CheckResult(NAME, name, PASS, what, props)
        return CheckResult(NAME, name, INCONCLUSIVE_STATUS[pc.inconclusive],
                           f"inconclusive after {comp.n_current} runs (the cap): {what}", props)

    @staticmethod
    def machine_slowdown(ctx: CheckContext, timing: dict, ratio: float, props: dict) -> str:
        """Is the machine itself slower than when golden was timed (epmci.perf.speed)? Sets
        props machine_* (machine_explains: it explains `ratio` within min effect); says how."""
        then = timing.get("machine_speed")
        if not then:
            return "golden records no machine speed, so a slower machine cannot be told from a slower engine"
        now = machine_speed(ctx.model_path)
        share = timing.get("io_wait_share")
        ok, factor, how = explains(then, now, share or 0.0, ratio, ctx.cfg.perf.min_effect)
        props.update(machine_speed_then=then, machine_speed_now=now, machine_factor=round(factor, 4),
                     machine_explains=ok)
        return how + ("" if share is not None else " (golden records no read-wait share: compute only)")

    def rss(self, ctx: CheckContext, ev: Evidence, name: str) -> CheckResult:
        """Peak RSS under the budget every run was started with, and no more than the
        golden's plus the allowed growth (perf.rss_growth_pct or perf.rss_growth_mb, whichever
        is larger): memory is the resource of the small box, and an engine that doubles its
        memory is still far under a generous budget."""
        pc, g, runs = ctx.cfg.perf, ev.golden, ev.first + ev.timed
        peak = max(m.peak_rss_mb for m in runs)
        swap = max(m.vm_swap_mb for m in runs)
        props = {"peak_rss_mb": peak, "budget_mb": pc.ram_budget_mb, "vm_swap_mb": swap, "runs": len(runs)}
        problems, gtxt = [], ", no golden to compare growth with"
        if peak > pc.ram_budget_mb:
            problems.append(f"peak RSS {peak:.1f} MiB over the budget {pc.ram_budget_mb:g} MiB")
        if g is not None:
            gold = float(g["peak_rss_mb"])
            limit = round(gold + max(gold * pc.rss_growth_pct / 100, pc.rss_growth_mb), 1)
            props.update(golden_peak_rss_mb=gold, rss_limit_mb=limit)
            gtxt = f", golden {gold:.1f} MiB (limit {limit:.1f} = +max({pc.rss_growth_pct:g} %, {pc.rss_growth_mb:g} MiB))"
            if peak > limit:
                problems.append(f"peak RSS {peak:.1f} MiB grew past golden {gold:.1f} MiB + max("
                                f"{pc.rss_growth_pct:g} %, {pc.rss_growth_mb:g} MiB) = {limit:.1f} MiB")
        if problems:
            return CheckResult(NAME, name, FAIL, "; ".join(problems) + f" (budget {pc.ram_budget_mb:g} MiB{gtxt})", props)
        return CheckResult(NAME, name, PASS, f"peak RSS {peak:.1f} MiB <= budget {pc.ram_budget_mb:g} MiB{gtxt}, "
                                             f"VmSwap {swap:.1f} MiB", props)

SUITE = PerfSuite()
