"""contract: the conformance suite -- does the engine speak docs/engine-contract.md? Each
documented behaviour is probed by a run and reported as its own result, so an engine written
from the page sees which sentence it got wrong:

- the declaration (--contract-info), and refusals: an unknown flag, a missing model file, a
  prompt + -n beyond -c -- exit 2, one line on stderr naming the flag, file or setting;
- a generation of contract.text (special tokens, several scripts) with -n contract.n_predict:
  the prompt tokenized as the reference does (special tokens parsed, no BOS) -- the prefill
  count and the logits of every prompt position against the reference --, the logits row
  count P + G - 1, the text on stdout (the generated tokens' bytes), every stats field in
  the documented order, and their semantics (decode tokens = G - 1, rates and per-token
  figures as documented, rounding);
- the chat template's exact bytes (a prompt without --no-chat), -n 0 and -n 1 (no decode
  record, P rows), the end of generation (a copy of the model whose eos token is the one the
  engine generates first: it must stop after it), seeded sampling reproducible;
- per declared feature: teacher forcing (the generation's tokens given back with --tokens-in
  give its logits byte for byte), the pager's refusals (a bad SDQ_* value, an arena below
  the minimum) and --no-pager's zero paging counters, a selftest out of range, the MoE
  dump's rows and the routing profile's counts (against the dump).

Logits are compared with the reference by CheckContext.logits_rule("reference"): exactly
for an engine that declares reference_exact, else within model_suite.max_kl. contract.items
picks items ([] = all).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np

from ...compare.counters import counter_changes
from ...compare.logits import compare_logits
from ...contract.capabilities import FEATURES, INFO_FLAG, parse_contract_info
from ...contract.inputs import write_tokens
from ...contract.outputs import (STATS_FIELDS, ContractError, counters_of, read_logits, read_moe_dump, read_profile,
                                 read_stats, stats_fields)
from ...contract.pace import PacedEngine, PaceError
from ...contract.process import EngineRun, run_engine
from ...contract.runspec import LOGITS_FILE, STATS_FILE, RunSpec, selftest_args
from ...errors import InputError
from ...gguf.patch import with_int_value
from ...reference.tokenizer import ReferenceTokenizer
from ..capabilities import engine_for_model, lacks
from ..context import CheckContext
from ..reference_runs import whole_model
from ..result import FAIL, PASS, SKIP, CheckResult
from .base import Task

NAME = "contract"
CHAT_TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
CHAT_PROMPT = "hello"
UNKNOWN_FLAG = "--epmci-no-such-flag"
SAMPLING = (0.8, 7)          # --temp, --seed of the sampling item


@dataclasses.dataclass
class Run:
    """One probe run and what it wrote."""
    run: EngineRun
    out: Path
    rows: np.ndarray | None = None
    stats: list[dict] | None = None
    problem: str | None = None       # why its outputs are unusable


class Probe:
    """An item's verdict: PASS unless a problem was found; the runs behind it give the time,
    the command lines and the stderr tail."""

    def __init__(self, ctx: CheckContext, name: str):
        self.ctx, self.name, self.t0 = ctx, name, time.perf_counter()
        self.problems: list[str] = []
        self.props: dict = {}
        self.runs: list[EngineRun] = []

    def need(self, ok: bool, problem: str) -> bool:
        if not ok:
            self.problems.append(problem)
        return ok

    def result(self, passed: str) -> CheckResult:
        tail = self.runs[-1].stderr_tail() if self.runs else ""
        details = "\n".join(f"command: {r.command_line()}" for r in self.runs)
        if self.problems:
            return CheckResult(NAME, self.name, FAIL, "; ".join(self.problems), self.props,
                               time.perf_counter() - self.t0, tail, details)
        return CheckResult(NAME, self.name, PASS, passed, self.props, time.perf_counter() - self.t0, tail, details)


class ContractSuite:
    name = NAME
    title = "contract: the engine's flags, exit codes, outputs and stats as docs/engine-contract.md specifies them"
    description = __doc__
    requires: tuple[str, ...] = ()

    # name -> (features it needs, the check)
    def items(self) -> dict[str, tuple[tuple[str, ...], Callable[[CheckContext, str], CheckResult]]]:
        return {
            "contract-info": ((), self.declaration),
            "unknown flag": ((), self.unknown_flag),
            "missing model file": ((), self.missing_model),
            "prompt + -n beyond -c": ((), self.context_overflow),
            "tokenization": ((), self.tokenization),
            "logits rows": ((), self.logits_rows),
            "generated text": ((), self.generated_text),
            "stats fields": ((), self.stats_fields),
            "stats semantics": ((), self.stats_semantics),
            "chat template": ((), self.chat_template),
            "-n 0": ((), lambda ctx, n: self.no_decode(ctx, n, 0)),
            "-n 1": ((), lambda ctx, n: self.no_decode(ctx, n, 1)),
            "end of generation": ((), self.end_of_generation),
            "seeded sampling": ((), self.sampling),
            "output flags change nothing": ((), self.output_flags),
            "flags of undeclared features": ((), self.undeclared_flags),
            "teacher forcing": (("teacher_forcing",), self.teacher_forcing),
            "pacing": (("pacing",), self.pacing),
            "bad SDQ_* value": (("pager",), self.bad_env),
            "arena below the minimum": (("pager",), self.small_arena),
            "--no-pager stats": (("pager",), self.resident_stats),
            "selftest out of range": (("selftest",), self.selftest_range),
            "MoE dump": (("moe_dump",), self.moe_dump),
            "routing profile": (("profile",), self.profile),
        }

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        items, wanted = self.items(), ctx.cfg.contract.items
        unknown = [n for n in wanted if n not in items]
        if unknown:
            raise InputError(ctx.cfg.source, f"contract.items: unknown {unknown} (items: {', '.join(items)})")
        out: list[Task | CheckResult] = []
        for name, (needs, fn) in items.items():
            if wanted and name not in wanted:
                continue
            missing = ctx.caps.lacking(needs)
            out.append(lacks(NAME, name, missing, ctx.caps) if missing else
                       Task(NAME, name, lambda fn=fn, name=name: [fn(ctx, name)], names=[name], cost=1.0))
        return out

    # -------------------------------------------------------------- shared runs and facts

    @staticmethod
    def tokenizer(ctx: CheckContext) -> ReferenceTokenizer:
        return ctx.shared("contract-tokenizer", lambda: ReferenceTokenizer.of(ctx.mf))

    def prompt_ids(self, ctx: CheckContext) -> list[int]:
        """contract.text as the contract tokenizes -p: special tokens parsed, no BOS."""
        return self.tokenizer(ctx).encode(ctx.cfg.contract.text, parse_special=True)

    def run(self, ctx: CheckContext, label: str, spec: RunSpec, env: dict | None = None,
            model: Path | None = None) -> Run:
        out = ctx.dir("contract-" + "".join(c if c.isalnum() else "-" for c in label))
        for f in (STATS_FILE, LOGITS_FILE):
            (out / f).unlink(missing_ok=True)
        r = Run(ctx.run(f"contract {label}", spec, out, env, model), out)
        if not r.run.ok:
            r.problem = r.run.failure()
            return r
        try:
            r.rows = read_logits(out / LOGITS_FILE) if spec.dump_logits else None
            r.stats = read_stats(out / STATS_FILE)
        except ContractError as e:
            r.problem = f"output unusable: {e}"
        return r

    def generation(self, ctx: CheckContext) -> Run:
        """contract.text, -n contract.n_predict, greedy, --no-chat; the MoE dump and the routing
        profile when the engine has them. Shared by the items that read it."""
        def make():
            spec = ctx.spec(ctx.cfg.contract.text, n_predict=ctx.cfg.contract.n_predict)
            out = ctx.dir("contract-generation")
            if ctx.engine.has("profile"):
                spec.profile_out = str(out / "routing.profile")
            return self.run(ctx, "generation", spec, {"SDQ_MOE_DUMP": str(out / "moe")} if ctx.engine.has("moe_dump") else {})
        return ctx.shared("contract-generation", make)

    def generated(self, ctx: CheckContext, rows: np.ndarray, P: int, n_predict: int) -> list[int]:
        """The tokens a greedy run generated, from its logits rows: the first maximum of each
        row from P - 1 on, through the first end-of-generation token or n_predict."""
        out: list[int] = []
        for row in rows[P - 1:]:
            if len(out) == n_predict:
                break
            out.append(int(np.argmax(row)))
            if out[-1] in self.tokenizer(ctx).eog:
                break
        return out

    def reference_rows(self, ctx: CheckContext, tokens: list[int]) -> np.ndarray:
        return whole_model(ctx.mf, ctx.model_sha256(), np.array(tokens, dtype=np.int32)).logits

    def same_as_reference(self, ctx: CheckContext, p: Probe, rows: np.ndarray, tokens: list[int], what: str,
                          meaning: str = "") -> None:
        ref = self.reference_rows(ctx, tokens)
        n = min(len(tokens), len(rows))
        diff, rule = compare_logits(ref[:n], rows[:n]), ctx.logits_rule("reference")
        p.props.update({f"{what}_{k}": v for k, v in diff.props().items() if k in ("max_abs_err", "max_kl", "identical")})
        p.need(diff.passes(rule),
               f"{meaning}the logits of the {what} positions differ from the reference's on the contract's tokens "
               f"({rule.text()}): {diff.text()}")

    def used(self, p: Probe, r: Run) -> bool:
        p.runs.append(r.run)
        return p.need(r.problem is None, r.problem or "")

    @staticmethod
    def phases(stats: list[dict]) -> dict[str, dict]:
        return {s["phase"]: s for s in stats}

    # -------------------------------------------------------------- refusals

    def refusal(self, ctx: CheckContext, name: str, args: list[str], words: list[str], env: dict | None = None,
                why: str = "") -> CheckResult:
        """exit 2 and exactly one line on stderr with `: error: ` and each of `words`."""
        p = Probe(ctx, name)
        run = run_engine(ctx.engine, args, timeout=ctx.cfg.engine.timeout_s, label=f"contract {name}", env=env)
        p.runs.append(run)
        lines = [l for l in run.stderr.splitlines() if l.strip()]
        p.props.update(returncode=run.returncode, stderr_lines=len(lines))
        if p.need(run.returncode == 2, f"{why}: exit 2 expected, got {run.failure() or 'exit 0'}"):
            p.need(len(lines) == 1, f"{why}: exactly one line on stderr expected, got {len(lines)}"
                                    + (f" (the last: {lines[-1][:120]!r})" if lines else ""))
            if lines:
                p.need(": error: " in lines[-1], f"the line must read `<name>: error: <what>: <problem>`, got "
                                                 f"{lines[-1][:160]!r}")
                missing = [w for w in words if w not in lines[-1]]
                p.need(not missing, f"the line must name {', '.join(map(repr, missing))}: {lines[-1][:160]!r}")
        return p.result(f"exit 2, one line: {(lines or [''])[-1][:160]}")

    def unknown_flag(self, ctx: CheckContext, name: str) -> CheckResult:
        return self.refusal(ctx, name, ["-m", str(ctx.model_path), "-p", "a", "-n", "1", UNKNOWN_FLAG], [UNKNOWN_FLAG],
                            why=f"an unknown flag ({UNKNOWN_FLAG})")

    def missing_model(self, ctx: CheckContext, name: str) -> CheckResult:
        path = ctx.dir("contract-missing-model") / "no-such-model.gguf"
        return self.refusal(ctx, name, ["-m", str(path), "-p", "a", "-n", "1", "--no-chat"], [str(path)],
                            why="a model file that does not exist")

    def context_overflow(self, ctx: CheckContext, name: str) -> CheckResult:
        P = len(self.prompt_ids(ctx))
        spec = dataclasses.replace(ctx.spec(ctx.cfg.contract.text, n_predict=2), ctx=P + 1)
        return self.refusal(ctx, name, spec.args(ctx.model_path, ctx.dir("contract-overflow"), ctx.engine.has("pager")),
                            [], why=f"a {P}-token prompt with -n 2 and -c {P + 1}")

    def bad_env(self, ctx: CheckContext, name: str) -> CheckResult:
        spec = ctx.spec(ctx.cfg.contract.text, n_predict=1)
        return self.refusal(ctx, name, spec.args(ctx.model_path, ctx.dir("contract-env"), True), ["SDQ_PREFETCH"],
                            env={"SDQ_PREFETCH": "2"}, why="SDQ_PREFETCH=2 (out of range)")

    def small_arena(self, ctx: CheckContext, name: str) -> CheckResult:
        spec = ctx.spec(ctx.cfg.contract.text, n_predict=1, arena_mb=0.001)
        return self.refusal(ctx, name, spec.args(ctx.model_path, ctx.dir("contract-arena"), True), ["arena"],
                            why="--arena-mb 0.001 (below the minimum)")

    def selftest_range(self, ctx: CheckContext, name: str) -> CheckResult:
        L = ctx.facts.n_layer
        out = ctx.dir("contract-selftest") / "selftest.bin"
        args = selftest_args(ctx.model_path, [(L, 0, 1, out)], threads=1, ctx=ctx.cfg.engine.ctx,
                             batch=ctx.cfg.run.batch, arena_mb=ctx.arena_mb())
        return self.refusal(ctx, name, args, [], why=f"--selftest {L}:0:1 (layer {L} of a {L}-layer model)")

    # -------------------------------------------------------------- the declaration

    def declaration(self, ctx: CheckContext, name: str) -> CheckResult:
        p = Probe(ctx, name)
        run = run_engine(ctx.engine, [INFO_FLAG], timeout=ctx.cfg.engine.timeout_s, label="contract info")
        p.runs.append(run)
        if not p.need(run.ok, f"{INFO_FLAG} must print a JSON object and exit 0: {run.failure()}"):
            return p.result("")
        text = run.stdout.decode("utf-8", "replace")
        try:
            caps = parse_contract_info(text, INFO_FLAG)
        except ContractError as e:
            p.need(False, e.problem)
            return p.result("")
        p.need(len(text.strip().splitlines()) == 1, f"{INFO_FLAG} must print one line (one JSON object), got "
                                                    f"{len(text.strip().splitlines())}")
        p.need(caps.contract == 2, f"declares contract {caps.contract}; this is contract 2")
        unknown = sorted(caps.features - set(FEATURES))
        p.need(not unknown, f"declares features the contract does not have: {', '.join(unknown)} "
                            f"(known: {', '.join(FEATURES)})")
        for f in ("selftest", "profile"):
            p.need(f not in caps.features or "pager" in caps.features, f"declares {f} without pager (it needs the pager)")
        p.need("selftest_batch" not in caps.features or "selftest" in caps.features,
               "declares selftest_batch without selftest (it needs the selftest)")
        problem = engine_for_model(caps, ctx.mf)
        p.need(problem is None, problem or "")
        p.props.update(caps.to_dict())
        return p.result(f"contract {caps.contract}, {caps.name} {caps.version}: {', '.join(caps.architectures)}; "
                        f"features {', '.join(sorted(caps.features)) or 'none'}")

    # -------------------------------------------------------------- the generation

    def tokenization(self, ctx: CheckContext, name: str) -> CheckResult:
        p, g, ids = Probe(ctx, name), self.generation(ctx), self.prompt_ids(ctx)
        if self.used(p, g):
            evaluated = self.phases(g.stats).get("prefill", {}).get("tokens")
            p.props.update(reference_tokens=len(ids), engine_prefill_tokens=evaluated)
            if p.need(evaluated == len(ids), f"contract.text tokenizes to {len(ids)} tokens (special tokens parsed, "
                                             f"no BOS), the engine evaluated {evaluated} prompt positions"):
                self.same_as_reference(ctx, p, g.rows, ids, "prompt")
        rule = ctx.logits_rule("reference").text()
        return p.result(f"{len(ids)} tokens (special tokens parsed, no BOS), every prompt position = the reference "
                        f"({rule})")

    def logits_rows(self, ctx: CheckContext, name: str) -> CheckResult:
        p, g, P = Probe(ctx, name), self.generation(ctx), len(self.prompt_ids(ctx))
        if self.used(p, g):
            G = len(self.generated(ctx, g.rows, P, ctx.cfg.contract.n_predict))
            p.props.update(rows=len(g.rows), prompt_tokens=P, generated=G)
            p.need(len(g.rows) == P + G - 1, f"{len(g.rows)} logits rows for a {P}-token prompt and {G} generated "
                                             f"tokens: expected P + G - 1 = {P + G - 1}")
        return p.result(f"{len(g.rows) if g.rows is not None else 0} rows = P + G - 1")

    def generated_text(self, ctx: CheckContext, name: str) -> CheckResult:
        p, g, P = Probe(ctx, name), self.generation(ctx), len(self.prompt_ids(ctx))
        if self.used(p, g):
            want = self.tokenizer(ctx).text(self.generated(ctx, g.rows, P, ctx.cfg.contract.n_predict)) + "\n"
            got = g.run.stdout.decode("utf-8", "replace")
            p.need(got == want, f"stdout must be the generated tokens' text and a newline: expected {want!r}, got "
                                f"{got[:200]!r}")
        return p.result("stdout is the generated tokens' text and a newline")

    def stats_fields(self, ctx: CheckContext, name: str) -> CheckResult:
        p, g = Probe(ctx, name), self.generation(ctx)
        fields = stats_fields(ctx.engine.has("pager"))
        if self.used(p, g):
            p.need([s["phase"] for s in g.stats] == ["prefill", "decode"],
                   f"one prefill then one decode record expected, got {[s['phase'] for s in g.stats]}")
            for s in g.stats:
                missing = [f for f in fields if f not in s]
                p.need(not missing, f"{s['phase']}: documented field(s) missing: {', '.join(missing)}")
                order = [f for f in s if f in STATS_FIELDS]
                p.need(order == [f for f in STATS_FIELDS if f in s], f"{s['phase']}: fields not in the documented "
                                                                     f"order: {', '.join(order)}")
                bad = [f for f in fields if f in s and f != "phase" and
                       (not isinstance(s[f], (int, float)) or isinstance(s[f], bool) or not math.isfinite(s[f]))]
                p.need(not bad, f"{s['phase']}: not a finite number: {', '.join(bad)}")
        return p.result(f"{len(fields)} documented fields in order in every record")

    def stats_semantics(self, ctx: CheckContext, name: str) -> CheckResult:
        p, g, P = Probe(ctx, name), self.generation(ctx), len(self.prompt_ids(ctx))
        if not self.used(p, g):
            return p.result("")
        G = len(self.generated(ctx, g.rows, P, ctx.cfg.contract.n_predict))
        ph = self.phases(g.stats)
        pre, dec = ph.get("prefill", {}), ph.get("decode", {})
        p.need(pre.get("tokens") == P, f"prefill tokens {pre.get('tokens')}: the prompt has {P}")
        p.need(dec.get("tokens") == G - 1, f"decode tokens {dec.get('tokens')}: {G} generated tokens are "
                                           f"G - 1 = {G - 1} decode steps")
        for s in g.stats:
            self.record_semantics(ctx, p, s)
        return p.result(f"prefill {P} tokens, decode G - 1 = {G - 1}; rates, per-token figures and rounding as "
                        f"documented")

    def record_semantics(self, ctx: CheckContext, p: Probe, s: dict) -> None:
        """The documented relations between one record's fields."""
        def near(a, b, tol) -> bool:
            return isinstance(a, (int, float)) and abs(a - b) <= tol

        ph, n, secs = s["phase"], s.get("tokens", 0), s.get("seconds", 0)
        p.need(secs > 0 and near(s.get("tok_s"), n / secs, 1e-3 * n / secs + 1e-4),
               f"{ph}: tok_s {s.get('tok_s')} is not tokens / seconds = {n} / {secs}")
        p.need(s.get("peak_rss_mb", 0) > 0 and s.get("vm_swap_mb", -1) >= 0,
               f"{ph}: peak_rss_mb {s.get('peak_rss_mb')} must be > 0 and vm_swap_mb {s.get('vm_swap_mb')} >= 0 (MiB)")
        if not ctx.engine.has("pager"):
            return
        h, m, ssd = s.get("hits", 0), s.get("misses", 0), s.get("ssd_bytes", 0)
        issued, used = s.get("prefetch_issued", 0), s.get("prefetch_used", 0)
        p.need(h + m > 0, f"{ph}: no expert lookups (hits + misses = 0)")
        p.need(s.get("hit_rate") == (round(100 * h / (h + m), 4) if h + m else 0),
               f"{ph}: hit_rate {s.get('hit_rate')} is not 100 * hits / (hits + misses) to 4 decimals")
        p.need(s.get("ssd_bytes_per_token") == (round(ssd / n, 3) if n else 0),
               f"{ph}: ssd_bytes_per_token {s.get('ssd_bytes_per_token')} is not ssd_bytes / tokens to 3 decimals")
        p.need(s.get("prefetch_used_rate") == (round(100 * used / issued, 4) if issued else 0),
               f"{ph}: prefetch_used_rate {s.get('prefetch_used_rate')} is not 100 * used / issued to 4 decimals")
        p.need(used <= issued, f"{ph}: prefetch_used {used} > prefetch_issued {issued}")
        p.need(s.get("io_bytes", -1) >= ssd, f"{ph}: io_bytes {s.get('io_bytes')} < ssd_bytes {ssd}")
        p.need(s.get("n_slots") == s.get("n_slots_small", 0) + s.get("n_slots_large", 0),
               f"{ph}: n_slots {s.get('n_slots')} != n_slots_small + n_slots_large")
        asked = ctx.arena_mb()
        p.need(0 < s.get("arena_mb", 0) <= asked + 1e-3, f"{ph}: arena_mb {s.get('arena_mb')} must be in (0, "
                                                        f"{asked:.3f}] (the --arena-mb asked for)")
        p.need(s.get("ram_need_mb", 0) > 0, f"{ph}: ram_need_mb {s.get('ram_need_mb')} must be > 0")

    def chat_template(self, ctx: CheckContext, name: str) -> CheckResult:
        p = Probe(ctx, name)
        ids = self.tokenizer(ctx).encode(CHAT_TEMPLATE.format(prompt=CHAT_PROMPT), parse_special=True)
        r = self.run(ctx, "chat", dataclasses.replace(ctx.spec(CHAT_PROMPT, n_predict=1), chat=True))
        if self.used(p, r):
            evaluated = self.phases(r.stats).get("prefill", {}).get("tokens")
            want = (f"-p {CHAT_PROMPT!r} without --no-chat must evaluate the contract's template "
                    f"{CHAT_TEMPLATE.format(prompt=CHAT_PROMPT)!r}: ")
            if p.need(evaluated == len(ids), f"{want}{len(ids)} tokens, the engine evaluated {evaluated}"):
                self.same_as_reference(ctx, p, r.rows, ids, "template", want)
        rule = ctx.logits_rule("reference").text()
        return p.result(f"the template's {len(ids)} tokens, every position = the reference ({rule})")

    def no_decode(self, ctx: CheckContext, name: str, n: int) -> CheckResult:
        p, P = Probe(ctx, name), len(self.prompt_ids(ctx))
        r = self.run(ctx, name, ctx.spec(ctx.cfg.contract.text, n_predict=n))
        if self.used(p, r):
            p.need(len(r.rows) == P, f"{len(r.rows)} logits rows: -n {n} evaluates the {P} prompt positions only")
            phases = [s["phase"] for s in r.stats]
            p.need(phases == ["prefill"], f"stats records {phases}: with no decode step there is no decode record")
            want = (self.tokenizer(ctx).text([int(np.argmax(r.rows[P - 1]))]) if n and len(r.rows) >= P else "") + "\n"
            got = r.run.stdout.decode("utf-8", "replace")
            p.need(got == want, f"stdout {got[:120]!r}, expected {want!r}")
        return p.result(f"{P} rows, a prefill record only, stdout {'one token' if n else 'an empty line'}")

    def end_of_generation(self, ctx: CheckContext, name: str) -> CheckResult:
        """A copy of the model whose eos token is the first token the engine generates: the
        engine must generate it, print it, and stop."""
        p, g, P = Probe(ctx, name), self.generation(ctx), len(self.prompt_ids(ctx))
        if not self.used(p, g):
            return p.result("")
        first = int(np.argmax(g.rows[P - 1]))
        model = with_int_value(ctx.model_path, ctx.dir("contract-eos") / "eos.gguf", "tokenizer.ggml.eos_token_id", first)
        r = self.run(ctx, "end of generation", ctx.spec(ctx.cfg.contract.text, n_predict=ctx.cfg.contract.n_predict),
                     model=model)
        p.props["eos_token"] = first
        if self.used(p, r):
            phases = [s["phase"] for s in r.stats]
            p.need(len(r.rows) == P and phases == ["prefill"],
                   f"with token {first} as tokenizer.ggml.eos_token_id, generation must end after it: expected {P} "
                   f"rows and no decode record, got {len(r.rows)} rows and records {phases}")
            want = self.tokenizer(ctx).text([first]) + "\n"
            got = r.run.stdout.decode("utf-8", "replace")
            p.need(got == want, f"the end-of-generation token is printed like any other: expected {want!r}, "
                                f"got {got[:120]!r}")
        return p.result(f"stopped after the eos token {first} (generated and printed, not fed back)")

    def sampling(self, ctx: CheckContext, name: str) -> CheckResult:
        p, P = Probe(ctx, name), len(self.prompt_ids(ctx))
        temp, seed = SAMPLING
        spec = dataclasses.replace(ctx.spec(ctx.cfg.contract.text, n_predict=ctx.cfg.contract.n_predict),
                                   temp=temp, seed=seed)
        a, b = self.run(ctx, "sampling a", spec), self.run(ctx, "sampling b", spec)
        if self.used(p, a) and self.used(p, b):
            p.need(a.run.stdout == b.run.stdout and a.rows.tobytes() == b.rows.tobytes(),
                   f"--temp {temp} --seed {seed} twice: text or logits differ (the same seed must give the same run)")
            G = ctx.cfg.contract.n_predict
            p.need(P <= len(a.rows) <= P + G - 1, f"{len(a.rows)} logits rows for a {P}-token prompt and at most "
                                                  f"{G} generated tokens")
        return p.result(f"--temp {temp} --seed {seed}: two runs, the same text and logits")

    def output_flags(self, ctx: CheckContext, name: str) -> CheckResult:
        """The generation without --dump-logits: the same text and the same exact counters."""
        p, g = Probe(ctx, name), self.generation(ctx)
        spec = dataclasses.replace(ctx.spec(ctx.cfg.contract.text, n_predict=ctx.cfg.contract.n_predict),
                                   dump_logits=False)
        r = self.run(ctx, "no logits", spec)
        if self.used(p, g) and self.used(p, r):
            p.need(r.run.stdout == g.run.stdout, f"without --dump-logits the engine printed {r.run.stdout[:80]!r}, "
                                                 f"with it {g.run.stdout[:80]!r}: an output flag changed the run")
            changes = counter_changes(counters_of(g.stats), counters_of(r.stats))
            p.need(not changes, "without --dump-logits the exact counters differ: "
                                + "; ".join(c.text() for c in changes[:3]))
        return p.result("with and without --dump-logits: the same text and exact counters")

    def undeclared_flags(self, ctx: CheckContext, name: str) -> CheckResult:
        """Each flag of a feature the engine does not declare is refused as an unknown flag."""
        out = ctx.dir("contract-undeclared")
        flags = {"pager": ["--arena-mb", "64"], "selftest": ["--selftest", f"0:0:1:{out / 'st.bin'}"],
                 "profile": ["--profile-out", str(out / "routing.profile")],
                 "teacher_forcing": ["--tokens-in", str(out / "tokens.bin")], "pacing": ["--pace-fds", "0,1"]}
        missing = [f for f in flags if not ctx.engine.has(f)]
        if not missing:
            return CheckResult(NAME, name, SKIP, "the engine declares every feature that has a flag: nothing to probe")
        base = ["-m", str(ctx.model_path), "-p", ctx.cfg.contract.text, "-n", "2", "--no-chat"]
        results = [self.refusal(ctx, name, base + flags[f], [flags[f][0]], why=f"{flags[f][0]} (feature {f}, "
                                                                               f"not declared)") for f in missing]
        bad = [r for r in results if r.status != PASS]
        if bad:
            return bad[0]
        return CheckResult(NAME, name, PASS, f"refused, one line each: {', '.join(flags[f][0] for f in missing)} "
                                             f"(features {', '.join(missing)} not declared)",
                           {"probed": missing}, sum(r.seconds for r in results))

    def pacing(self, ctx: CheckContext, name: str) -> CheckResult:
        """A paced generation: ready, one step report per decode step, end; then the same run as
        without pacing, byte for byte."""
        p, g = Probe(ctx, name), self.generation(ctx)
        if not self.used(p, g):
            return p.result("")
        out = ctx.dir("contract-pacing")
        for f in (STATS_FILE, LOGITS_FILE):
            (out / f).unlink(missing_ok=True)
        spec = ctx.spec(ctx.cfg.contract.text, n_predict=ctx.cfg.contract.n_predict)
        paced = PacedEngine(ctx.engine, ctx.model_path, spec, out, timeout=ctx.cfg.engine.timeout_s,
                            label=f"contract {name}")
        try:
            paced.wait_ready()
            while paced.step() is not None:
                pass
            run = paced.finish()
        except PaceError as e:
            if e.run is not None:
                p.runs.append(e.run)
            p.need(False, f"the pacing protocol: {e.reason}")
            return p.result("")
        p.runs.append(run)
        steps = (self.phases(g.stats).get("decode") or {}).get("tokens", 0)
        p.props.update(steps=len(paced.steps), decode_tokens=steps)
        if p.need(run.ok, f"the paced run failed: {run.failure()}"):
            p.need(len(paced.steps) == steps, f"{len(paced.steps)} step reports for {steps} decode steps")
            try:
                rows = read_logits(out / LOGITS_FILE)
                p.need(rows.tobytes() == g.rows.tobytes() and run.stdout == g.run.stdout,
                       f"paced, the run must be the same run byte for byte: text or logits differ "
                       f"({compare_logits(g.rows, rows).text()})")
            except ContractError as e:
                p.need(False, f"the paced run's output is unusable: {e}")
        return p.result(f"ready, {len(paced.steps)} step reports, end; logits and text = the unpaced run's")

    # -------------------------------------------------------------- features

    def teacher_forcing(self, ctx: CheckContext, name: str) -> CheckResult:
        p, g, ids = Probe(ctx, name), self.generation(ctx), self.prompt_ids(ctx)
        if not self.used(p, g):
            return p.result("")
        gen = self.generated(ctx, g.rows, len(ids), ctx.cfg.contract.n_predict)
        tokens = ids + gen[:-1]
        out = ctx.dir("contract-teacher-forcing")
        write_tokens(out / "tokens.bin", tokens, len(ids))
        spec = dataclasses.replace(ctx.spec("", n_predict=0), tokens_in=str(out / "tokens.bin"))
        r = self.run(ctx, "teacher forcing", spec)
        if self.used(p, r):
            ph = self.phases(r.stats)
            p.need(ph.get("prefill", {}).get("tokens") == len(ids) and
                   ph.get("decode", {}).get("tokens", 0) == len(gen) - 1,
                   f"--tokens-in of {len(ids)} prefill + {len(gen) - 1} tokens: the stats count "
                   f"{ph.get('prefill', {}).get('tokens')} prefill + {ph.get('decode', {}).get('tokens', 0)} decode")
            p.need(r.rows.tobytes() == g.rows.tobytes(),
                   f"the generation's tokens given back with --tokens-in must give its logits byte for byte: "
                   f"{compare_logits(g.rows, r.rows).text()}")
            p.need(r.run.stdout == b"\n", f"stdout must be an empty line (nothing generated), got {r.run.stdout[:80]!r}")
        return p.result(f"{len(tokens)} tokens given: the generation's logits byte for byte")

    def resident_stats(self, ctx: CheckContext, name: str) -> CheckResult:
        p = Probe(ctx, name)
        r = self.run(ctx, "no-pager", ctx.spec(ctx.cfg.contract.text, n_predict=2, pager=False))
        if self.used(p, r):
            paging = [f for f in STATS_FIELDS if f not in ("phase", "tokens", "seconds", "tok_s", "peak_rss_mb",
                                                             "vm_swap_mb")]
            nonzero = sorted({f for s in r.stats for f in paging if s.get(f, 0) != 0})
            p.need(not nonzero, f"--no-pager: the paging fields must be 0, but {', '.join(nonzero)} are not")
        return p.result("--no-pager: every paging field 0")

    def moe_dump(self, ctx: CheckContext, name: str) -> CheckResult:
        p, g, f = Probe(ctx, name), self.generation(ctx), ctx.facts
        if self.used(p, g):
            for il in range(f.n_layer):
                try:
                    d = read_moe_dump(g.out / f"moe.{il}", layer=il, n_embd=f.n_embd, k=f.n_expert_used)
                except ContractError as e:
                    p.need(False, str(e))
                    break
                if not p.need(d.n_rows == len(g.rows), f"moe.{il}: {d.n_rows} rows, the run evaluated "
                                                        f"{len(g.rows)} positions"):
                    break
        return p.result(f"{f.n_layer} layers, one row per evaluated position")

    def profile(self, ctx: CheckContext, name: str) -> CheckResult:
        p, g, f = Probe(ctx, name), self.generation(ctx), ctx.facts
        if not self.used(p, g):
            return p.result("")
        try:
            prof = read_profile(g.out / "routing.profile")
        except ContractError as e:
            p.need(False, str(e))
            return p.result("")
        p.need(prof == sorted(prof, key=lambda x: (-x[2], x[0], x[1])),
               "lines must be sorted by count descending, then layer, then expert")
        p.need(all(0 <= l < f.n_layer and 0 <= e < f.n_expert and c > 0 for l, e, c in prof),
               "a line's layer or expert is out of range, or its count is not positive")
        if ctx.engine.has("moe_dump"):       # count = micro-batches in which the expert was routed
            want: Counter = Counter()
            try:
                for il in range(f.n_layer):
                    for rec in read_moe_dump(g.out / f"moe.{il}", layer=il).records:
                        want.update((il, int(e)) for e in set(rec.selected.ravel().tolist()))
            except ContractError as e:
                p.need(False, f"no MoE dump to check the counts against: {e}")
            else:
                got = {(l, e): c for l, e, c in prof}
                p.need(got == dict(want), f"counts differ from the routing the run dumped at "
                                          f"{sum(1 for k in set(got) | set(want) if got.get(k) != want.get(k))} "
                                          f"(layer, expert) pairs")
        return p.result(f"{len(prof)} (layer, expert) lines, sorted, counts = the dumped routing")


SUITE = ContractSuite()
