"""Layer 6, model: the engine's logits at every position of a long prompt and of the decode
steps after it, against the reference's whole-model forward on the same tokens.

The prompt (prompts.model repeated) reaches model_suite.context_fraction of the model's
context length and crosses many micro-batches (model_suite.batch); then the engine decodes
model_suite.n_predict tokens greedily, one step at a time. The reference tokenizes the
prompt itself (epmci/reference/tokenizer.py), takes the generated tokens from the engine's
own logits (the greedy choice of each row) and evaluates the whole sequence at once,
teacher-forced. Paged, default settings, with the MoE dump, so a difference is located: the
first differing position (in the prompt or in decode) and the first layer whose MoE input
differs there.

Catches what the per-layer checks cannot: attention, RoPE, the KV cache and the decode path
at long context (a position offset after the first micro-batch, a cache row written at the
wrong position, RoPE wrong beyond some position, decode steps that see a stale cache), and
an engine that evaluates other positions than it was given (an extra BOS token, a chat
template around a --no-chat prompt).

On a model with delta-net layers (qwen35moe) the run also dumps their state after every
micro-batch (SDQ_STATE_DUMP; an engine without the state_dump feature gets a SKIP), and a
third result compares each with the reference's state
after the same position (epmci/check/state_check.py): a state not carried across
micro-batches, a conv window off by a token, a state reset between prefill and decode, each
named by the first micro-batch and layer where it shows.

Compared by CheckContext.logits_rule("reference"): exactly for an engine that declares
reference_exact (the bundled engine), else within a tolerance (model_suite.max_kl).
Teacher-forced decode: an engine compared within a tolerance that declares teacher_forcing
runs the text prompt without decoding, and its decode steps are then fed the reference's
tokens (--tokens-in: the prompt's tokens, then model_suite.n_predict tokens of
prompts.model, each evaluated alone as a decode step), so every position is compared
whatever the engine would have generated. An engine compared exactly keeps the text-prompt
path with its own greedy decode.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ...compare.arrays import Tolerance
from ...compare.logits import LogitsRule, compare_logits
from ...contract.inputs import write_tokens
from ...contract.outputs import ContractError, read_logits, read_moe_dump
from ...contract.runspec import LOGITS_FILE, STATS_FILE
from ...reference.tokenizer import ReferenceTokenizer
from ..capabilities import lacks
from ..context import CheckContext
from ..reference_runs import whole_model
from ..routing import reference_routing_agreement
from ..state_check import STATE_FILE, StateVerdict, compare_states, deltanet_layers, read_states
from ..result import FAIL, PASS, CheckResult
from .base import Task, run_failed

NAME = "model"
RESULTS = ("prompt positions", "decode positions")
STATE_RESULT = "delta-net state"
CTX_SLACK = 64


def repeated(text: str, tokenizer: ReferenceTokenizer, positions: int) -> tuple[str, list[int]]:
    """`text` repeated until it tokenizes to at least `positions` tokens."""
    prompt = text
    while len(ids := tokenizer.encode(prompt, parse_special=False)) < positions:
        prompt += text
    return prompt, ids


def long_prompt(text: str, tokenizer: ReferenceTokenizer, positions: int) -> tuple[str, list[int]]:
    """`text` whole (the tokenizer cases it was written to cover), then repeated and cut at
    a character to at most `positions` tokens: the prompt positions the plan derived bound
    the reference's work (model_suite.max_positions), where whole repeats overshot them (214
    for 128 on a production-size model: 1.7x the reference's work)."""
    prompt, ids = repeated(text, tokenizer, positions)
    if len(ids) == positions or prompt == text:
        return prompt, ids
    lo, hi = len(text), len(prompt)      # the longest cut whose count fits (binary search)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(prompt[:mid], parse_special=False)) <= positions:
            lo = mid
        else:
            hi = mid - 1
    return prompt[:lo], tokenizer.encode(prompt[:lo], parse_special=False)


class ModelSuite:
    name = NAME
    title = "model: every position of a long prompt and of decode vs the whole-model reference"
    description = __doc__
    requires: tuple[str, ...] = ()

    @staticmethod
    def states(ctx: CheckContext) -> bool:
        """The run dumps delta-net states and a third result compares them."""
        return bool(deltanet_layers(ctx.mf)) and ctx.engine.has("state_dump")

    def names(self, ctx: CheckContext) -> list[str]:
        return list(RESULTS) + ([STATE_RESULT] if self.states(ctx) else [])

    @staticmethod
    def teacher_forced(ctx: CheckContext) -> bool:
        """Its decode steps are fed the reference's tokens (--tokens-in), not its own. Under an
        exact rule the engine's own greedy tokens are as good (every position is compared
        bit for bit up to the first difference, which is named) and cost no second run."""
        return ctx.logits_rule("reference").mode != "exact" and ctx.engine.has("teacher_forcing")

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        tokenizer = ReferenceTokenizer.of(ctx.mf)
        prompt, ids = long_prompt(ctx.cfg.prompts.model, tokenizer, ctx.plan.model_positions)
        task = Task(NAME, "whole model", lambda: self.check(ctx, prompt, ids), names=self.names(ctx), cost=4.0)
        if deltanet_layers(ctx.mf) and not self.states(ctx):
            return [task, lacks(NAME, STATE_RESULT, ["state_dump"], ctx.caps)]
        return [task]

    def check(self, ctx: CheckContext, prompt: str, prompt_ids: list[int]) -> list[CheckResult]:
        ms, out = ctx.cfg.model_suite, ctx.dir("model")
        forced, states = self.teacher_forced(ctx), self.states(ctx)
        # room beyond prompt + decode: an engine that evaluates more positions than it was
        # given must still run, so the check can say so
        spec = dataclasses.replace(ctx.spec(prompt, n_predict=1 if forced else ms.n_predict, batch=ms.batch),
                                   ctx=len(prompt_ids) + ms.n_predict + CTX_SLACK)
        env = {"SDQ_MOE_DUMP": str(out / "moe")} if ctx.engine.has("moe_dump") else {}
        if states:
            env["SDQ_STATE_DUMP"] = str(out / STATE_FILE)
        run = ctx.run("model", spec, out, env=env)
        if not run.ok:
            return run_failed(NAME, self.names(ctx), run)
        rule, P = ctx.logits_rule("reference"), len(prompt_ids)
        res = _Results(self.names(ctx), run, {"mode": rule.mode, "prompt_tokens": P, "batch": ms.batch,
                                               "teacher_forced": forced})
        if rule.mode == "kl":
            res.props["max_kl_allowed"] = rule.max_kl
        rows, problem = self._engine_rows(ctx, run, out, P, res.props)
        if problem:
            return res.all_fail(problem)
        # the tokens of the decode positions: the reference's when teacher-forced, else the
        # engine's greedy choice (first maximum) of each row from P-1 on
        fed = [int(t) for t in np.argmax(rows[P - 1:-1], axis=1)] if rows.shape[0] > P else []
        given = self.given_tokens(ctx) if forced else []
        tokens = np.array(prompt_ids + (given if forced else fed), dtype=np.int32)
        dumped, state_error = {}, None
        if states:
            try:
                dumped = read_states(ctx.mf, out)
            except ContractError as e:
                state_error = f"state dump unusable: {e}"
        positions = [r.position for r in next(iter(dumped.values()))] if dumped else []
        ref = whole_model(ctx.mf, ctx.model_sha256(), tokens, [p for p in positions if p < len(tokens)])
        if ref.logits.shape[1] != rows.shape[1]:
            return res.all_fail(f"logits rows have {rows.shape[1]} values, the model's vocabulary is "
                                f"{ref.logits.shape[1]}")
        res.props["decode_steps"] = len(fed)
        routing = self._routing(ctx, out, ref.moe_in, len(tokens), res.props)
        res.add(*self.span(ctx, out, ref, rows, 0, P, "prompt", rule, res.props, routing))
        if forced:
            res.add(*self.forced_decode(ctx, prompt_ids, given, ref.logits, rule, res.props))
        elif rows.shape[0] <= P:
            res.add(FAIL, f"no decode positions to compare (the engine decoded {len(fed) + 1} tokens, "
                          f"asked for {ms.n_predict})")
        else:
            res.add(*self.span(ctx, out, ref, rows, P, rows.shape[0], "decode", rule, res.props, routing))
        if states:
            tol = Tolerance() if rule.mode == "exact" else ctx.cfg.layer.tolerance
            v = (compare_states(dumped, ref.state, rows.shape[0], P, tol) if dumped
                 else StateVerdict(False, state_error, {}))
            res.props.update(v.props)
            res.add(PASS if v.ok else FAIL, f"{rule.text()}: {v.message}" if v.ok else v.message)
        return res.results()

    def _engine_rows(self, ctx: CheckContext, run, out, P: int, props: dict) -> tuple[np.ndarray, str | None]:
        """The run's logits rows, or why they cannot be compared."""
        if run.slot_errors:
            return np.zeros(0), f"engine reported a slot error: {run.slot_errors[0]}"
        try:
            rows = read_logits(out / LOGITS_FILE)
            prefill = [r for r in ctx.stats(out / STATS_FILE) if r["phase"] == "prefill"]
        except ContractError as e:
            return np.zeros(0), f"output unusable: {e}"
        evaluated = int(prefill[0].get("tokens", -1)) if prefill else -1
        props.update(engine_prompt_positions=evaluated, rows=int(rows.shape[0]))
        if evaluated != P:
            return rows, (f"the engine evaluated {evaluated} prompt positions, the reference tokenizes the "
                          f"prompt (--no-chat) to {P} tokens: the engine does not evaluate the prompt it was "
                          f"given (a BOS token added, a chat template, another tokenization?)")
        if rows.shape[0] < P:
            return rows, f"{rows.shape[0]} logits rows for a {P}-token prompt"
        return rows, None

    @staticmethod
    def _routing(ctx: CheckContext, out, ref_moe_in: np.ndarray, positions: int, props: dict) -> str:
        """Per layer, how often the engine routed as the reference (from its MoE dump): a
        sentence for the messages ("" without a dump), the numbers into props."""
        if not ctx.engine.has("moe_dump"):
            return ""
        try:
            agreement = reference_routing_agreement(ctx.mf, out / "moe", ref_moe_in, positions)
        except ContractError as e:
            return f"; no routing agreement ({e})"
        props.update(agreement.props())
        return f"; {agreement.text()}"

    def span(self, ctx: CheckContext, out, ref, rows: np.ndarray, lo: int, hi: int, what: str, rule: LogitsRule,
             props: dict, routing: str = "") -> tuple[str, str]:
        """Positions lo..hi-1 of the engine's own run against the reference; `routing` is
        the routing agreement's sentence."""
        P = hi if what == "prompt" else lo
        diff = compare_logits(ref.logits[lo:hi], rows[lo:hi])
        props.update({f"{what}_{k}": v for k, v in diff.props().items()})
        props[f"{what}_kl"] = [float(f"{x:.3g}") for x in diff.kl]       # per position: the report's plot
        span = f"positions {lo}..{hi - 1}" if what == "prompt" else f"decode steps at positions {lo}..{hi - 1}"
        if diff.passes(rule):
            return PASS, f"{rule.text()}: {span}: {diff.text()}{routing}"
        first = lo + (diff.first_bad(rule) or 0)
        props[f"{what}_first_differing_position"] = first
        where = self._first_layer(ctx, out, ref.moe_in, first)
        step = "" if what == "prompt" else f" (decode step {first - P + 1})"
        return FAIL, (f"{span} differ from the reference ({rule.text()}): first at position {first}{step}; "
                      f"{where}; {diff.text()}{routing}")

    @staticmethod
    def given_tokens(ctx: CheckContext) -> list[int]:
        """The decode steps' tokens of a teacher-forced run: n_predict tokens of prompts.model."""
        ids = ReferenceTokenizer.of(ctx.mf).encode(ctx.cfg.prompts.model, parse_special=False)
        return [ids[i % len(ids)] for i in range(ctx.cfg.model_suite.n_predict)]

    def forced_decode(self, ctx: CheckContext, prompt_ids: list[int], given: list[int], ref_logits: np.ndarray,
                      rule: LogitsRule, props: dict) -> tuple[str, str]:
        """The decode positions, teacher-forced: the prompt, then the given tokens with
        --tokens-in, every position against the reference's logits of that sequence."""
        ms = ctx.cfg.model_suite
        tokens, P = prompt_ids + given, len(prompt_ids)
        out = ctx.dir("model-teacher-forced")
        write_tokens(out / "tokens.bin", tokens, P)
        spec = dataclasses.replace(ctx.spec("", n_predict=0, batch=ms.batch), ctx=len(tokens) + CTX_SLACK,
                                   tokens_in=str(out / "tokens.bin"))
        run = ctx.run("model teacher-forced", spec, out)
        if not run.ok:
            return FAIL, f"the teacher-forced run (--tokens-in) failed: {run.failure()}"
        try:
            rows = read_logits(out / LOGITS_FILE)
            evaluated = {r["phase"]: int(r["tokens"]) for r in ctx.stats(out / STATS_FILE)}
        except ContractError as e:
            return FAIL, f"the teacher-forced run's output is unusable: {e}"
        span = f"decode steps at positions {P}..{len(tokens) - 1}, teacher-forced"
        if rows.shape[0] != len(tokens) or evaluated.get("prefill") != P or evaluated.get("decode") != ms.n_predict:
            return FAIL, (f"--tokens-in of {P} prefill + {ms.n_predict} decode tokens: the engine wrote "
                          f"{rows.shape[0]} logits rows and evaluated {evaluated.get('prefill', 0)} prefill + "
                          f"{evaluated.get('decode', 0)} decode positions (docs/engine-contract.md, Teacher forcing)")
        whole, decode = compare_logits(ref_logits[:P], rows[:P]), compare_logits(ref_logits[P:], rows[P:])
        props.update({f"decode_{k}": v for k, v in decode.props().items()}, decode_steps=ms.n_predict,
                     decode_kl=[float(f"{x:.3g}") for x in decode.kl])
        if not whole.passes(rule):
            return FAIL, (f"teacher-forced: the prompt positions of the --tokens-in run differ from the reference "
                          f"({rule.text()}): {whole.text()}")
        if decode.passes(rule):
            return PASS, f"{rule.text()}: {span}: {decode.text()}"
        first = P + (decode.first_bad(rule) or 0)
        props["decode_first_differing_position"] = first
        return FAIL, (f"{span} differ from the reference ({rule.text()}): first at position {first} (decode step "
                      f"{first - P + 1}); {decode.text()}")

    def _first_layer(self, ctx: CheckContext, out, moe_in: np.ndarray, pos: int) -> str:
        """The first layer whose MoE input (from the engine's dump) differs at `pos`."""
        f = ctx.facts
        try:
            for il in range(f.n_layer):
                h = read_moe_dump(out / f"moe.{il}", layer=il, n_embd=f.n_embd, k=f.n_expert_used).concat().h
                if h.shape[0] <= pos:
                    return f"the MoE dump of layer {il} has only {h.shape[0]} rows"
                if h[pos].tobytes() != moe_in[il, pos].tobytes():
                    mixer = "delta net" if ctx.mf.hp.is_recurrent(il) else "attention"
                    if il == 0:
                        return f"layer 0's MoE input already differs (embedding or layer 0's {mixer})"
                    return (f"the first layer whose MoE input differs there is layer {il} (layer {il - 1}'s "
                            f"input is equal: layer {il - 1}'s MoE output or layer {il}'s {mixer})")
        except ContractError as e:
            return f"no MoE dump to locate the layer ({e})"
        return "every layer's MoE input equals the reference there: the last layer's MoE or the output head"


class _Results:
    """The suite's results in the order of its names, filled one verdict at a time."""

    def __init__(self, names: list[str], run, props: dict):
        self.names, self.run, self.props = names, run, props
        self.t0 = time.perf_counter()
        self.verdicts: list[tuple[str, str]] = []

    def add(self, status: str, message: str) -> None:
        self.verdicts.append((status, message))

    def all_fail(self, message: str) -> list[CheckResult]:
        self.verdicts = [(FAIL, message)] * len(self.names)
        return self.results()

    def results(self) -> list[CheckResult]:
        secs = self.run.seconds + time.perf_counter() - self.t0
        details = f"command: {self.run.command_line()}"
        return [CheckResult(NAME, n, st, m, dict(self.props), secs if i == 0 else 0.0, self.run.stderr_tail(), details)
                for i, (n, (st, m)) in enumerate(zip(self.names, self.verdicts, strict=True))]


SUITE = ModelSuite()
