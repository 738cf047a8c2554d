"""Perf and drift: exact counters, correctness fingerprints, tok/s and peak RSS against the
golden baseline of the runner profile (golden/<profile>/<model id>.yaml), and with
--perf-base REF tok/s against the engine of a git ref measured in the same run.

Per scenario (perf.scenarios, experiments of `epmci bench`), every prompt of perf.prompts
is run once with the model's page cache dropped; the first prompt is also the timed one
(perf.repeats runs; --fast skips the tok/s comparison against golden; an UNKNOWN verdict buys more up to
perf.max_repeats), run after the other prompts, which warm up for it. Timed runs are
exclusive: they start after every other check finished and run one at a time (with
--no-timing nothing is timed and the scenario runs alongside the other checks).

- counters: every exact stats counter of every prompt and phase equals golden. A worse one
  (more misses, evictions, bytes; fewer hits, used prefetches) or a change with no
  direction (slots, tokens) fails; a better one passes with a note to refresh golden.
- fingerprint: generated tokens, logits digest and text digest equal golden; on a mismatch
  the KL divergence and top-1 agreement against the golden logits rows say how far it
  drifted.
- decode tok/s vs golden: Mann-Whitney U on the samples plus a minimum effect size:
  SAME / DIFFERENT / UNKNOWN. Skipped (not passed) with --no-timing, without a timing
  baseline, or on a machine whose fingerprint differs from the one golden was recorded on.
- peak RSS: under perf.ram_budget_mb (every perf run is also started with that budget).
- decode tok/s vs base (--perf-base): paired ABBA runs of perf.base_n_predict tokens, ratio
  with a bootstrap CI and a Wilcoxon signed-rank (or sign) test.

No golden file for the profile and model: those checks are skipped with the command that
records one.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...bench import EXPERIMENTS
from ...errors import InputError
from ...golden import Golden, find, golden_path, golden_root, model_identity
from ...machine import fingerprint as machine_fingerprint
from ...machine import mismatches
from ...measure import Measurement, RunSpec, counter_changes, drift, io_diagnosis, measure
from ...stats import DIFFERENT, SAME, UNKNOWN, compare_samples, per_look_alpha
from ..context import CheckContext, mib
from ..result import ERROR, FAIL, PASS, SKIP, CheckResult
from .base import Task

NAME = "perf"
# settings that decide counters and fingerprints (threads and the RAM budget do not)
COUNTER_SETTINGS = ("prompts", "n_predict", "batch", "ctx")
# Share of the machine's CPU that other processes took during a timed run (measure.py)
# above which the run is called out: its tok/s measured the neighbours as well.
BUSY_WARN_PCT = 20.0


def _busy_note(pct: float | None) -> str:
    if pct is None or pct < BUSY_WARN_PCT:
        return ""
    return f" -- WARNING: other processes used {pct:.0f}% of the CPU meanwhile; this sample is low"


def prompt_label(i: int, prompt: str) -> str:
    p = prompt if len(prompt) <= 20 else prompt[:17] + "..."
    return f"p{i + 1} {p!r}"


@dataclass
class PerfPlan:
    """What every perf task needs, resolved once at planning time."""
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

    def record_hint(self) -> str:
        return f"epmci golden update --profile {self.profile} --reason \"...\""


def perf_settings(ctx: CheckContext) -> dict:
    pc = ctx.cfg.perf
    return {"prompts": list(pc.prompts), "n_predict": pc.n_predict, "batch": pc.batch, "ctx": pc.ctx,
            "threads": ctx.cfg.engine.threads, "ram_budget_mb": pc.ram_budget_mb, "golden_rows": pc.golden_rows}


def scenario_specs(ctx: CheckContext, name: str, routing: str | None = None) -> list[RunSpec]:
    pc = ctx.cfg.perf
    fixed = {"n_predict": pc.n_predict, "ctx": pc.ctx, "batch": pc.batch, "threads": ctx.cfg.engine.threads,
             "arena_fraction": pc.arena_fraction, "ram_budget_mb": pc.ram_budget_mb}
    return [EXPERIMENTS[name].spec(p, fixed, ctx.facts.total_expert_bytes(), routing,
                                   lambda b, u: mib(ctx.facts.min_arena_bytes(b, u)))
            for p in pc.prompts]


def prepare(ctx: CheckContext, load_golden: bool = True) -> PerfPlan:
    """Golden lookup (InputError for an unusable golden file: exit 2) and run settings."""
    pc = ctx.cfg.perf
    ident = model_identity(ctx.model_path)
    root = golden_root(pc.golden_dir, ctx.cfg.source)
    gfile = golden_path(root, pc.profile, ident["id"])
    golden = find(root, pc.profile, ident["id"]) if load_golden else None
    if golden is not None and golden.model.get("sha256") != ident["sha256"]:
        raise InputError(gfile, f"recorded for model sha256 {golden.model['sha256'][:16]}..., but "
                                f"{ctx.model_path} has sha256 {ident['sha256'][:16]}... (same id {ident['id']}): "
                                f"the model generator changed without a version bump, or the file is damaged")
    plan = PerfPlan(ident, golden, gfile, pc.profile, machine_fingerprint(ctx.model_path.parent),
                    perf_settings(ctx))
    plan.repeats = pc.fast_repeats if ctx.cfg.fast else pc.repeats
    for name in pc.scenarios:
        plan.specs[name] = scenario_specs(ctx, name)
    if pc.base and load_golden:
        from ...perf_base import repo_root, resolve_ref
        start = Path(ctx.cfg.source).parent if ctx.cfg.source not in (None, "<defaults>") else Path.cwd()
        plan.repo = repo_root(start)
        plan.base_sha = resolve_ref(plan.repo, pc.base)
    return plan


def timing_order(n_prompts: int) -> list[int]:
    """Run order of a scenario's prompts: the timed first prompt last, so the other prompts'
    runs warm up (numba's cache files, the interpreter) for its first timed sample."""
    return list(range(1, n_prompts)) + [0]


def result_names(ctx: CheckContext, scen: str) -> list[str]:
    names = [f"{scen}: counters"]
    names += [f"{scen}: fingerprint {prompt_label(i, p)}" for i, p in enumerate(ctx.cfg.perf.prompts)]
    names += [f"{scen}: decode tok/s vs golden", f"{scen}: peak RSS"]
    return names


class PerfSuite:
    name = NAME
    title = "perf: counters, fingerprints, tok/s and peak RSS vs golden; --perf-base A/B"
    description = __doc__

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        plan = prepare(ctx)
        pc = ctx.cfg.perf
        items: list[Task | CheckResult] = []
        for scen in pc.scenarios:
            names = result_names(ctx, scen)
            timed = pc.timing and self._timing_skip(ctx, plan, scen) is None
            runs = len(pc.prompts) + (plan.repeats - 1 if timed else 0)
            items.append(Task(NAME, scen, lambda s=scen: self.scenario(ctx, plan, s), names=names,
                              cost=float(runs), exclusive=timed))
            if pc.base:
                bname = f"{scen}: decode tok/s vs base {pc.base}"
                if not pc.timing:
                    items.append(CheckResult(NAME, bname, SKIP, "timing comparisons skipped (--no-timing): "
                                             "--perf-base not run", {"verdict": "SKIPPED"}))
                else:
                    items.append(Task(NAME, bname, lambda s=scen, n=bname: [self.versus_base(ctx, plan, s, n)],
                                      names=[bname], cost=2.0 * pc.base_pairs, exclusive=True))
        return items

    # -------------------------------------------------------------- golden side

    def _golden_scenario(self, plan: PerfPlan, scen: str) -> tuple[dict | None, str | None]:
        """(golden scenario, None) or (None, why the comparison is skipped)."""
        if plan.golden is None:
            return None, (f"no golden baseline for profile {plan.profile!r} and model {plan.model_id['id']} "
                          f"({plan.golden_file} does not exist): record one with `{plan.record_hint()}`")
        g = plan.golden.scenario(scen)
        if g is None:
            return None, (f"golden {plan.golden_file.name} has no scenario {scen!r}: record it with "
                          f"`{plan.record_hint()}`")
        return g, None

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
        if ctx.cfg.fast and plan.base_sha is None:
            # A laptop's quick gate: three unpaired runs on a busy machine produced false
            # alarms (x0.43 under a concurrent test suite); timing wants the full check on
            # the profile's runner, or --perf-base.
            return ("timing comparison skipped by --fast (run without --fast on the profile's machine, "
                    "or with --perf-base REF)")
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
        pc = ctx.cfg.perf
        names = result_names(ctx, scen)
        specs = plan.specs[scen]
        t0 = time.perf_counter()
        if EXPERIMENTS[scen].needs_routing_profile:
            routing = ctx.dir(f"perf-{scen}") / "routing.profile"
            base_specs = scenario_specs(ctx, "baseline")
            base_specs[0].profile_out = str(routing)
            m = measure(ctx.engine, ctx.model_path, base_specs[0], ctx.dir(f"perf-{scen}-routing"),
                        timeout=ctx.cfg.engine.timeout_s, label=f"perf {scen} routing")
            if not m.ok:
                return self._failed(names, m, "routing profile run: ")
            specs = scenario_specs(ctx, scen, str(routing))
        timing_skip = self._timing_skip(ctx, plan, scen)
        first: list[Measurement | None] = [None] * len(specs)
        for i in timing_order(len(specs)):
            m = measure(ctx.engine, ctx.model_path, specs[i], ctx.dir(f"perf-{scen}-p{i}"),
                        timeout=ctx.cfg.engine.timeout_s, keep_rows=pc.golden_rows, label=f"perf {scen} p{i + 1}")
            if not m.ok:
                return self._failed(names, m, f"prompt {i + 1} run: ")
            first[i] = m
        timed = [first[0]]
        if timing_skip is None:
            for r in range(plan.repeats - 1):
                m = self._timed_run(ctx, specs[0], scen, len(timed))
                if not m.ok:
                    return self._failed(names, m, f"timed run {r + 2}: ")
                timed.append(m)
        g, why = self._golden_scenario(plan, scen)
        out = [self.counters(plan, scen, names[0], g, why, first, timed)]
        out += [self.fingerprint(plan, scen, names[1 + i], g, why, i, m) for i, m in enumerate(first)]
        out.append(self.timing(ctx, plan, scen, names[-2], g, timing_skip, specs[0], timed))
        out.append(self.rss(ctx, plan, names[-1], g, first + timed))
        out[0].seconds = time.perf_counter() - t0     # the scenario's runs, reported once
        return out

    def _timed_run(self, ctx: CheckContext, spec: RunSpec, scen: str, k: int) -> Measurement:
        return measure(ctx.engine, ctx.model_path, spec, ctx.dir(f"perf-{scen}-timed"),
                       timeout=ctx.cfg.engine.timeout_s, label=f"perf {scen} timed {k + 1}")

    def _failed(self, names: list[str], m: Measurement, what: str) -> list[CheckResult]:
        run = m.run
        props = {"returncode": run.returncode if run else None}
        tail = run.stderr_tail() if run else ""
        details = f"command: {run.command_line()}" if run else ""
        return [CheckResult(NAME, n, FAIL, f"{what}{m.failure}", dict(props), m.seconds, tail, details)
                for n in names]

    # -------------------------------------------------------------- verdicts

    def counters(self, plan, scen, name, g, why, first: list[Measurement], timed: list[Measurement]) -> CheckResult:
        props: dict = {"prompts": len(first)}
        unstable = [k + 1 for k, m in enumerate(timed[1:], 1)
                    if m.counters != first[0].counters or m.logits_sha256 != first[0].logits_sha256]
        d0 = first[0].counters.get("decode", {})
        props.update({f"decode_{k}": d0.get(k) for k in ("hits", "misses", "evictions", "ssd_bytes_per_token",
                                                          "prefetch_issued", "prefetch_used")})
        if unstable:
            props["unstable_runs"] = unstable
            return CheckResult(NAME, name, FAIL, f"counters or logits not reproducible: timed run(s) {unstable} of "
                                                 f"prompt 1 differ from its first run", props)
        if g is None:
            return CheckResult(NAME, name, SKIP, why, props)
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
        n = sum(len(ph) for m in first for ph in m.counters.values())
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

    def fingerprint(self, plan, scen, name, g, why, i: int, m: Measurement) -> CheckResult:
        fp = m.fingerprint()
        props = {"prompt_tokens": m.prompt_tokens, "generated": len(m.first_tokens), "logits_rows": m.logits_rows,
                 "logits_sha256": m.logits_sha256}
        if g is None:
            return CheckResult(NAME, name, SKIP, why, props)
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
            props.update(d.props())
            parts.append(d.text())
        else:
            parts.append("no golden logits rows to measure the drift")
        if plan.golden.machine and mismatches(plan.golden.machine, plan.machine):
            parts.append("note: this machine differs from the profile's, and float results of numpy/libm may "
                         "differ between CPUs")
        return CheckResult(NAME, name, FAIL, "output drifted from golden: " + "; ".join(parts), props)

    def timing(self, ctx, plan, scen, name, g, skip: str | None, spec: RunSpec, timed: list[Measurement]) -> CheckResult:
        pc = ctx.cfg.perf
        props: dict = {"verdict": "SKIPPED"}
        if skip is not None:
            if timed:
                props["current"] = timed[0].tok_s
            return CheckResult(NAME, name, SKIP, skip, props)
        base = [float(x) for x in g["timing"]["samples"]]
        cur = [m.tok_s for m in timed]
        alpha = per_look_alpha(pc.alpha, len(cur), pc.max_repeats)
        comp = compare_samples(base, cur, alpha, pc.min_effect)
        while comp.verdict == UNKNOWN and len(cur) < pc.max_repeats:
            for _ in range(min(2, pc.max_repeats - len(cur))):
                m = self._timed_run(ctx, spec, scen, len(timed))
                if not m.ok:
                    return self._failed([name], m, "extra timed run: ")[0]
                timed.append(m)
                cur.append(m.tok_s)
            comp = compare_samples(base, cur, alpha, pc.min_effect)
        props = {"baseline": round(comp.baseline, 4), "current": round(comp.current, 4),
                 "ratio": round(comp.ratio, 4), "p_value": round(comp.p_value, 5), "verdict": comp.verdict,
                 "ci_low": round(comp.ci[0], 4), "ci_high": round(comp.ci[1], 4),
                 "n_baseline": comp.n_baseline, "n_current": comp.n_current,
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
        if comp.verdict == DIFFERENT and comp.ratio < 1:
            io, why = io_diagnosis(g["prompts"][0]["counters"].get("decode", {}), timed[0].stats.get("decode", {}))
            props["io_regression"] = io
            return CheckResult(NAME, name, FAIL, f"tok/s regressed: {what}; {why}", props)
        if comp.verdict == DIFFERENT:
            return CheckResult(NAME, name, PASS, f"faster than golden: {what} (refresh golden with "
                                                 f"`{plan.record_hint()}`)", props)
        if comp.verdict == SAME:
            return CheckResult(NAME, name, PASS, what, props)
        status = {"skip": SKIP, "pass": PASS, "fail": FAIL}[pc.inconclusive]
        return CheckResult(NAME, name, status, f"inconclusive after {comp.n_current} runs (the cap): {what}", props)

    def rss(self, ctx, plan, name, g, runs: list[Measurement]) -> CheckResult:
        budget = ctx.cfg.perf.ram_budget_mb
        peak = max(m.peak_rss_mb for m in runs)
        swap = max(m.vm_swap_mb for m in runs)
        props = {"peak_rss_mb": peak, "budget_mb": budget, "vm_swap_mb": swap, "runs": len(runs)}
        gtxt = ""
        if g is not None:
            props["golden_peak_rss_mb"] = g["peak_rss_mb"]
            gtxt = f", golden {g['peak_rss_mb']:.1f} MiB"
        if peak > budget:
            return CheckResult(NAME, name, FAIL, f"peak RSS {peak:.1f} MiB over the budget {budget:g} MiB{gtxt}", props)
        return CheckResult(NAME, name, PASS, f"peak RSS {peak:.1f} MiB <= budget {budget:g} MiB{gtxt}, "
                                             f"VmSwap {swap:.1f} MiB", props)

    # -------------------------------------------------------------- --perf-base

    def versus_base(self, ctx: CheckContext, plan: PerfPlan, scen: str, name: str) -> CheckResult:
        from ...perf_base import Side, Worktree, base_side, build_base, run_abab
        from ...stats import DIFFERENT as DIFF
        pc = ctx.cfg.perf
        spec = dataclasses.replace(plan.specs[scen][0], n_predict=pc.base_n_predict)
        t0 = time.perf_counter()
        props: dict = {"base_ref": pc.base, "base_sha": plan.base_sha, "n_predict": pc.base_n_predict,
                       "test": pc.paired_test}
        try:
            with Worktree(plan.repo, plan.base_sha) as wt:
                side = base_side(wt, ctx.engine)
                ok, bmsg, brun = build_base(side, wt, ctx.engine, ctx.cfg.engine.build_cmd,
                                            ctx.cfg.engine.build_timeout_s)
                props["base_build"] = bmsg
                if not ok:
                    return CheckResult(NAME, name, ERROR, f"could not build the base engine at {plan.base_sha[:12]}: "
                                       f"{bmsg}", props, time.perf_counter() - t0,
                                       brun.stderr_tail() if brun else "")
                head = Side("head", ctx.engine, None, {})
                res = run_abab(head, side, ctx.model_path, spec, ctx.dir(f"perf-base-{scen}"),
                               pairs=pc.base_pairs, max_pairs=pc.base_max_pairs, alpha=pc.alpha,
                               min_effect=pc.min_effect, test=pc.paired_test,
                               timeout=max(ctx.cfg.engine.timeout_s, ctx.cfg.engine.build_timeout_s))
        except RuntimeError as e:
            return CheckResult(NAME, name, ERROR, str(e), props, time.perf_counter() - t0)
        secs = time.perf_counter() - t0
        if res.failure:
            run = res.failed_run.run if res.failed_run else None
            return CheckResult(NAME, name, FAIL, f"--perf-base: {res.failure}", props, secs,
                               run.stderr_tail() if run else "", f"command: {run.command_line()}" if run else "")
        c = res.comparison
        props.update({"baseline": round(c.baseline, 4), "current": round(c.current, 4), "ratio": round(c.ratio, 4),
                      "p_value": round(c.p_value, 5), "verdict": c.verdict, "ci_low": round(c.ci[0], 4),
                      "ci_high": round(c.ci[1], 4), "pairs": res.pairs, "alpha_per_look": round(res.alpha, 5),
                      "base_samples": [round(x, 4) for x in res.base], "head_samples": [round(x, 4) for x in res.head],
                      "order": "".join("A" if o == "base" else "B" for o in res.order)})
        same_out = (res.base_first.fingerprint() == res.head_first.fingerprint())
        props["outputs_equal_base"] = same_out
        what = (f"decode tok/s head {c.current:.2f} vs base {c.baseline:.2f} at {plan.base_sha[:12]} "
                f"(paired median ratio x{c.ratio:.3f}, 95% CI [{c.ci[0]:.3f}, {c.ci[1]:.3f}], "
                f"{'Wilcoxon signed-rank' if pc.paired_test == 'wilcoxon' else 'sign test'} "
                f"p={c.p_value:.3g} vs {res.alpha:.3g} per look, {res.pairs} ABBA pairs, {pc.base_n_predict} tokens): "
                f"{c.verdict}")
        if not same_out:
            what += "; note: head and base outputs differ"
        if c.verdict == DIFF and c.ratio < 1:
            io, why = io_diagnosis(res.base_first.stats.get("decode", {}), res.head_first.stats.get("decode", {}))
            props["io_regression"] = io
            return CheckResult(NAME, name, FAIL, f"tok/s regressed against the base: {what}; {why}", props, secs)
        if c.verdict == UNKNOWN:
            status = {"skip": SKIP, "pass": PASS, "fail": FAIL}[pc.inconclusive]
            return CheckResult(NAME, name, status, f"inconclusive after {res.pairs} pairs (the cap): {what}",
                               props, secs)
        return CheckResult(NAME, name, PASS, what, props, secs)


SUITE = PerfSuite()


# ------------------------------------------------------------------ recording (epmci golden update)

def record_golden(ctx: CheckContext, plan: PerfPlan, reason: str, *, timing: bool, repeats: int,
                  previous: Golden | None, say=lambda s: None) -> Golden:
    """Measure every scenario the way the check does and return the Golden to write. Raises
    RuntimeError when a run fails or is not reproducible (nothing is written then)."""
    import platform

    from ...golden import new_history, now
    pc = ctx.cfg.perf
    scenarios, logits = {}, {}
    peak_all = []
    busiest: float | None = None    # the most CPU other processes took during a timed run
    for scen in pc.scenarios:
        exp = EXPERIMENTS[scen]
        specs = plan.specs[scen]
        if exp.needs_routing_profile:
            routing = ctx.dir(f"golden-{scen}") / "routing.profile"
            bs = scenario_specs(ctx, "baseline")[0]
            bs.profile_out = str(routing)
            m = measure(ctx.engine, ctx.model_path, bs, ctx.dir(f"golden-{scen}-routing"),
                        timeout=ctx.cfg.engine.timeout_s, label="routing profile")
            if not m.ok:
                raise RuntimeError(f"{scen}: routing profile run failed: {m.failure}")
            specs = scenario_specs(ctx, scen, str(routing))
        first = [None] * len(specs)
        for i in timing_order(len(specs)):
            m = measure(ctx.engine, ctx.model_path, specs[i], ctx.dir(f"golden-{scen}-p{i}"),
                        timeout=ctx.cfg.engine.timeout_s, keep_rows=pc.golden_rows, label=f"{scen} p{i + 1}")
            if not m.ok:
                raise RuntimeError(f"{scen}: prompt {i + 1} run failed: {m.failure}\n{m.run.stderr_tail() if m.run else ''}")
            say(f"[golden] {scen} prompt {i + 1}/{len(specs)}: {m.tok_s:.2f} tok/s decode, "
                f"logits {m.logits_sha256[:12]}")
            first[i] = m
        timed = [first[0]]
        if timing:
            for r in range(repeats - 1):
                m = measure(ctx.engine, ctx.model_path, specs[0], ctx.dir(f"golden-{scen}-timed"),
                            timeout=ctx.cfg.engine.timeout_s, label=f"{scen} timed {r + 2}")
                if not m.ok:
                    raise RuntimeError(f"{scen}: timed run {r + 2} failed: {m.failure}")
                if m.counters != first[0].counters or m.logits_sha256 != first[0].logits_sha256:
                    raise RuntimeError(f"{scen}: timed run {r + 2} is not reproducible (counters or logits differ "
                                       f"from the first run): refusing to record")
                say(f"[golden] {scen} timed run {r + 2}/{repeats}: {m.tok_s:.2f} tok/s decode"
                    f"{_busy_note(m.other_cpu_pct)}")
                timed.append(m)
        samples = [round(m.tok_s, 4) for m in timed]
        busy = [m.other_cpu_pct for m in timed if m.other_cpu_pct is not None]
        if timing and busy:
            busiest = max(busiest or 0.0, *busy)
        runs = first + timed[1:]
        scenarios[scen] = {
            "args": dict(exp.args),
            "env": dict(exp.env),
            "prefetch": specs[0].prefetch,
            "arena_mb": specs[0].arena_mb,
            "timing": ({"metric": "decode tok/s", "samples": samples,
                        "median": round(statistics.median(samples), 4)} if timing else None),
            "peak_rss_mb": max(m.peak_rss_mb for m in runs),
            "vm_swap_mb": max(m.vm_swap_mb for m in runs),
            "prompts": [{**m.fingerprint(), "counters": m.counters} for m in first],
        }
        peak_all.append(scenarios[scen]["peak_rss_mb"])
        for i, m in enumerate(first):
            logits[f"{scen}/{i}"] = m.gen_rows
    from importlib.metadata import PackageNotFoundError, version
    try:
        ver = version("epmci")
    except PackageNotFoundError:
        ver = "unknown"
    return Golden(
        profile=plan.profile,
        model=plan.model_id,
        settings=plan.settings,
        scenarios=scenarios,
        machine=plan.machine,
        recorded={"date": now(), "reason": reason, "engine": ctx.engine.describe(), "epmci": ver,
                  "host": platform.node(), "timing": timing, "repeats": repeats if timing else 1,
                  **({"other_cpu_pct_max": busiest} if busiest is not None else {})},
        history=new_history(previous),
        logits=logits,
    )
