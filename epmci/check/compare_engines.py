"""`epmci compare`: two engines on the same tokens, position by position.

Engines generate their own tokens, so once one near-tie flips, nothing after it is
comparable between two free-running engines. Here both are teacher-forced
(docs/engine-contract.md, Teacher forcing): the same --tokens-in sequence -- a prompt of the
reference tokenizer's tokens, then `decode` more tokens each evaluated alone as a decode
step -- and every position's logits are compared: top-1 agreement, KL(A || B), max |diff|,
and at a disagreement, how close A's own top two were (a near-tie, or a real difference).
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..compare.logits import LogitsDiff, LogitsRule, compare_logits
from ..config.schema import CheckConfig
from ..contract.inputs import write_tokens
from ..contract.outputs import ContractError, read_logits, read_stats
from ..contract.process import EngineCommand
from ..contract.runspec import LOGITS_FILE, STATS_FILE, RunSpec, run
from ..errors import InputError
from ..gguf.file import ModelFile
from ..perf.settings import for_model
from ..reference.tokenizer import ReferenceTokenizer
from ..synth.store import resolve_model
from .capabilities import declared, engine_for_model
from .suites.model import repeated

CTX_SLACK = 16


@dataclass
class Thresholds:
    max_kl: float = 0.01       # nats, at every position
    min_top1: float = 0.98     # share of positions whose argmax agrees


@dataclass
class EngineComparison:
    model: str
    engines: list[str]                    # A, B as they describe themselves
    names: list[str]                      # their --contract-info names
    tokens: list[int]
    n_prefill: int
    batch: int
    thresholds: Thresholds
    diff: LogitsDiff                      # per position: top-1 of each, KL(A || B), max |diff|, A's margin
    seconds: list[float] = field(default_factory=list)

    @property
    def positions(self) -> int:
        return len(self.tokens)

    @property
    def top1_agreement(self) -> float:
        return self.diff.argmax_agree / self.positions

    @property
    def first_disagreement(self) -> int | None:
        return self.diff.first_bad(LogitsRule("argmax"))

    @property
    def passed(self) -> bool:
        return (self.diff.passes(LogitsRule("kl", self.thresholds.max_kl))
                and self.top1_agreement >= self.thresholds.min_top1)

    def phase(self, pos: int) -> str:
        return "prefill" if pos < self.n_prefill else "decode"

    def summary(self) -> dict:
        d = self.diff
        return {"positions": self.positions, "top1_agree": d.argmax_agree,
                "top1_agreement": round(self.top1_agreement, 6), "kl_mean": d.mean_kl,
                "kl_max": d.max_kl, "kl_max_position": int(d.kl.argmax()),
                "max_abs_diff": d.max_abs, "first_disagreement": self.first_disagreement,
                "passed": self.passed}

    def to_dict(self) -> dict:
        d = self.diff
        return {"format": "epmci-compare/1", "model": self.model, "engines": self.engines, "names": self.names,
                "n_prefill": self.n_prefill, "batch": self.batch,
                "thresholds": dataclasses.asdict(self.thresholds), "summary": self.summary(),
                "positions": [{"position": i, "phase": self.phase(i), "token": int(self.tokens[i]),
                               "top1_a": int(d.top1_a[i]), "top1_b": int(d.top1_b[i]),
                               "agree": bool(d.agree[i]), "kl": float(d.kl[i]),
                               "max_abs_diff": float(d.abs_diff[i]), "margin_a": float(d.margin_a[i])}
                              for i in range(self.positions)]}


def given_tokens(mf: ModelFile, prompt: str, positions: int, decode: int) -> list[int]:
    """`prompt` repeated to `positions` tokens, then `decode` tokens of it again."""
    tok = ReferenceTokenizer.of(mf)
    _, ids = repeated(prompt, tok, positions)
    ids = ids[:positions]
    return ids + [ids[i % len(ids)] for i in range(decode)]


def _engine(cfg: CheckConfig, cmd: str | None, mf: ModelFile) -> tuple[EngineCommand, str]:
    engine = EngineCommand.of_settings(cfg.engine, cmd)
    caps, why = declared(cfg, engine)
    if caps is None:
        raise InputError(engine.describe(), why)
    if not caps.has("teacher_forcing"):
        raise InputError(engine.describe(), f"engine lacks teacher_forcing ({caps.source}): epmci compare feeds "
                                            f"both engines the same tokens with --tokens-in")
    unusable = engine_for_model(caps, mf)
    if unusable:
        raise InputError(mf.path, unusable)
    return engine.with_features(caps.features), caps.name


def _logits(engine: EngineCommand, model: Path, tokens: list[int], n_prefill: int, batch: int, threads: int,
            out: Path, timeout: float) -> tuple[np.ndarray, float]:
    out.mkdir(parents=True, exist_ok=True)
    write_tokens(out / "tokens.bin", tokens, n_prefill)
    spec = RunSpec("", n_predict=0, batch=batch, ctx=len(tokens) + CTX_SLACK, threads=threads,
                   tokens_in=str(out / "tokens.bin"))
    r = run(engine, model, spec, out, timeout=timeout, label="compare")
    if not r.ok:
        raise InputError(engine.describe(), r.failure())
    try:
        rows = read_logits(out / LOGITS_FILE)
        read_stats(out / STATS_FILE, engine.stats_fields())
    except ContractError as e:
        raise InputError(engine.describe(), f"output unusable: {e}") from None
    if rows.shape[0] != len(tokens):
        raise InputError(engine.describe(), f"{rows.shape[0]} logits rows for {len(tokens)} --tokens-in tokens "
                                            f"(one per position: docs/engine-contract.md, Teacher forcing)")
    return rows, r.seconds


def compare_engines(cfg: CheckConfig, cmds: list[str | None], *, prompt: str, positions: int, decode: int,
                    batch: int, thresholds: Thresholds, workdir: str | None = None) -> EngineComparison:
    """Engines A and B (None: the bundled engine) on the same tokens. InputError (exit 2)
    when either cannot be compared: no teacher forcing, a failed run, unusable output."""
    model = resolve_model(cfg.model)
    mf = ModelFile(model)
    cfg, _ = for_model(cfg, mf)
    engines = [_engine(cfg, c, mf) for c in cmds]
    tokens = given_tokens(mf, prompt, positions, decode)
    with tempfile.TemporaryDirectory(prefix="epmci-compare-", dir=workdir) as td:
        (a, sa), (b, sb) = (_logits(e, model, tokens, positions, batch, cfg.engine.threads, Path(td) / side,
                                    cfg.engine.timeout_s) for (e, _), side in zip(engines, "ab"))
    if a.shape != b.shape:
        raise InputError("epmci compare", f"the engines' vocabularies differ ({a.shape[1]} vs {b.shape[1]} logits)")
    return EngineComparison(str(model), [e.describe() for e, _ in engines], [n for _, n in engines], tokens,
                            positions, batch, thresholds, compare_logits(a, b), [sa, sb])
