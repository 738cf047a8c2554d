"""The RAM budget of a paged run (`--ram-budget-mb`, docs/engine-contract.md "RAM
budget"): everything the run will hold, estimated before anything large is read or
allocated."""

from __future__ import annotations

from ..gguf_model import GGUFModel, ModelError
from ..stats import rss_bytes
from .arena import MiB

# Compiled kernels are loaded from numba's cache on first use after the budget check;
# measured on the ci model at ~60 MiB of code and LLVM state. Counted with the runtime.
JIT_ALLOWANCE = 96 * MiB


def work_buffer_bytes(gm: GGUFModel, batch: int, n_ctx: int, keep_logits: bool = True) -> int:
    """Upper estimate of the forward pass's transient arrays and of the logits a run keeps
    (every position's with keep_logits, else the few rows sampling needs)."""
    hp = gm.hp
    b = max(1, batch)
    per_row = 4 * (hp.n_embd * 24                       # residual, norms, q8 copies, MoE sums
                   + hp.n_head * hp.head_dim * 6         # q, k, v, attention output
                   + hp.n_head * n_ctx * 4               # attention probabilities (+ f16 copy)
                   + hp.n_expert_used * hp.n_embd * 3    # per-slot expert outputs
                   + hp.n_ff_exp * 8                     # gate, up, swiglu per row
                   + hp.n_expert * 4)                    # router
    if hp.ssm is not None:   # qwen35moe: delta-net projections, conv and heads; attn_q's gates; shared expert
        s = hp.ssm
        per_row += 4 * (s.conv_dim * 4 + s.value_dim * 8 + hp.n_head * hp.head_dim * 4
                        + hp.n_ff_shexp * 8 + hp.n_embd * 3)
    logit_rows = 2 * n_ctx + 3 * b if keep_logits else 8   # kept (+ concatenation) and the micro-batch's
    return b * per_row + 4 * logit_rows * hp.n_vocab


def breakdown(gm: GGUFModel, arena_bytes: int, kv_bytes: int, batch: int, n_ctx: int,
              transient_bytes: int, keep_logits: bool = True) -> dict[str, int]:
    """Bytes per item of the budget, in the order the refusal names them."""
    return {
        "resident weights": gm.resident_bytes(),
        "arena": arena_bytes,
        "KV cache": int(kv_bytes),
        "work buffers": work_buffer_bytes(gm, batch, n_ctx, keep_logits) + transient_bytes,
        "runtime": rss_bytes() + JIT_ALLOWANCE,
    }


def check(budget_mb: float, parts: dict[str, int], named: str | None = None) -> None:
    """ModelError unless the parts fit in budget_mb MiB; `named` says whose budget it is
    when the user gave none (default: --ram-budget-mb)."""
    total = sum(parts.values())
    if total > budget_mb * MiB:
        detail = " + ".join(f"{k} {v / MiB:.1f}" for k, v in parts.items())
        who = named or f"--ram-budget-mb {budget_mb:g}"
        raise ModelError(f"{who}: needs {total / MiB:.1f} MiB ({detail} MiB)")
