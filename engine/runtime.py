"""The engine's Python API: load a model, evaluate tokens, generate, collect stats.

The CLI (engine/cli.py) is a thin shell over this; epmci and the tests drive it in-process
too. Phases (prefill, decode) are timed and counted separately.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import kernels
from .gguf_model import ARCH, QWEN35, GGUFModel
from .model import ExpertStore, Model, ResidentExperts, kv_cache_bytes
from .paging.config import PagerConfig
from .qwen35moe import Qwen35Model, state_bytes
from .stats import PhaseStats, phase_counters
from .warmup import warm_up

# The forward pass of each architecture, and the bytes it keeps between micro-batches
# (KV cache; qwen35moe: attention layers only, plus the delta nets' state).
FORWARDS = {ARCH: (Model, kv_cache_bytes), QWEN35: (Qwen35Model, state_bytes)}

CHAT_TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Options:
    n_ctx: int = 512
    threads: int = 1
    batch: int = 32
    pager: bool = True
    pager_config: PagerConfig | None = None  # None: defaults from the environment
    # generate() returns every position's logits; False: only what sampling needs (at a
    # 248k-token vocabulary a 4096-token prompt's logits alone are 4 GB)
    keep_logits: bool = True
    # the product kernels (engine/kernels.py): "auto", "portable", "avx2" or "avx512"; same bits on each
    kernels: str = "auto"


class Engine:
    def __init__(self, model_path: str, options: Options | None = None):
        self.options = options or Options()
        kernels.set_threads(self.options.threads)
        kernels.set_kernel_path(self.options.kernels)
        self.gm = GGUFModel(model_path)
        self.tokenizer = self.gm.tokenizer
        self.experts: ExpertStore
        forward, cache_bytes = FORWARDS[self.gm.hp.arch]
        if self.options.pager:
            from .paging.pager import Pager   # --no-pager never imports the paging machinery
            cfg = self.options.pager_config or PagerConfig.from_env()
            # plans the arena and checks the budget before anything large is read or allocated
            self.experts = Pager(self.gm, cfg, batch=self.options.batch, n_ctx=self.options.n_ctx,
                                 kv_bytes=cache_bytes(self.gm.hp, self.options.n_ctx),
                                 keep_logits=self.options.keep_logits)
        else:
            self.experts = ResidentExperts(self.gm)
        try:
            if self.options.pager:
                self.experts.start()
            self.gm.load_resident()
            # no kernel is prepared inside a timed phase
            warm_up(forward, self.gm, self.experts.predictor if self.options.pager else None)
            self.model: Model = forward(self.gm, self.experts, self.options.n_ctx)
        except BaseException:
            self.close()   # stop the pager's reader threads
            raise
        self.phases: list[PhaseStats] = []

    # ------------------------------------------------------------ evaluation

    def close(self) -> None:
        self.experts.close()

    def eval(self, tokens, phase: str = "prefill", all_logits: bool = True) -> np.ndarray:
        """Evaluate tokens in micro-batches of `batch`; returns the logits of every position,
        or with all_logits=False of the last one only (1, n_vocab)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        stats = self._phase(phase)
        before = self.experts.counters()
        t0 = time.perf_counter()
        out = []
        b = max(1, self.options.batch)
        for i in range(0, len(tokens), b):
            rows = None if all_logits else (1 if i + b >= len(tokens) else 0)
            out.append(self.model.forward(tokens[i:i + b], rows))
        stats.seconds += time.perf_counter() - t0
        stats.tokens += len(tokens)
        self._accumulate(stats, before)
        return np.concatenate(out) if out else np.zeros((0, self.gm.hp.n_vocab), np.float32)

    def _phase(self, name: str) -> PhaseStats:
        for p in self.phases:
            if p.phase == name:
                return p
        p = PhaseStats(name)
        self.phases.append(p)
        return p

    def _accumulate(self, stats: PhaseStats, before: dict) -> None:
        stats.counters = phase_counters(stats.counters, before, self.experts.counters(), stats.tokens)

    def on_moe(self, fn) -> None:
        """Call fn(MoETrace) after every layer's MoE (per micro-batch; qwen35moe: a
        Qwen35Trace, with the shared expert's output)."""
        self.model.on_moe = fn

    def on_state(self, fn) -> None:
        """Call fn(StateTrace) after every delta-net layer (per micro-batch); qwen3moe has none."""
        if isinstance(self.model, Qwen35Model):
            self.model.on_state = fn

    # ------------------------------------------------------------ generation

    def encode_prompt(self, prompt: str, chat: bool) -> list[int]:
        text = CHAT_TEMPLATE.format(prompt=prompt) if chat else prompt
        return self.tokenizer.encode(text, parse_special=True)

    def generate(self, prompt_tokens: list[int], n_predict: int, temp: float = 0.0, seed: int = 0,
                 on_token=None, pacer=None) -> tuple[list[int], np.ndarray]:
        """Prefill, then decode up to n_predict tokens (stopping at EOS).

        Returns the generated ids and the logits of every evaluated position: the prompt's
        positions, then each generated token that was fed back (see docs/engine-contract.md);
        with Options.keep_logits False only the prompt's last position's.
        `pacer` (optional): its before_step() runs before and after_step() after each decode
        step, so a caller can hold every step and time it (the CLI's --pace-fds).
        """
        if not prompt_tokens:
            raise ValueError("empty prompt")
        if len(prompt_tokens) + n_predict > self.options.n_ctx:
            raise ValueError(f"prompt ({len(prompt_tokens)}) + n_predict ({n_predict}) exceeds context {self.options.n_ctx}")
        rng = np.random.default_rng(seed)
        rows = [self.eval(prompt_tokens, "prefill", self.options.keep_logits)]
        generated: list[int] = []
        last = rows[0][-1]
        for i in range(n_predict):
            tok = sample(last, temp, rng)
            generated.append(tok)
            if on_token:
                on_token(tok)
            if self.tokenizer.is_eog(tok) or i == n_predict - 1:
                break
            if pacer:
                pacer.before_step()
            last = self.eval([tok], "decode")[-1]
            if pacer:
                pacer.after_step()
            if self.options.keep_logits:
                rows.append(last[None, :])
        return generated, np.concatenate(rows)

    def teacher_force(self, tokens: list[int], n_prefill: int) -> np.ndarray:
        """Evaluate a given sequence (--tokens-in): the first n_prefill tokens as the prefill,
        then every later one alone as a decode step, exactly as if it had been generated. The
        logits of every position."""
        if len(tokens) > self.options.n_ctx:
            raise ValueError(f"--tokens-in: {len(tokens)} tokens exceed context {self.options.n_ctx}")
        rows = [self.eval(tokens[:n_prefill], "prefill")]
        rows += [self.eval([tok], "decode") for tok in tokens[n_prefill:]]
        return np.concatenate(rows)

    def stats_records(self) -> list[dict]:
        return [p.record() for p in self.phases]


def sample(logits: np.ndarray, temp: float, rng: np.random.Generator) -> int:
    """Greedy at temp <= 0 (first maximum), else softmax(logits / temp) sampled with rng."""
    if temp <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temp
    p = np.exp(z - z.max())
    p /= p.sum()
    return int(rng.choice(len(p), p=p))
