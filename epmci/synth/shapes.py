"""Seeded valid model shapes the presets are not: for the property test that a correct
engine passes the gate on every valid model (tests/test_shapes.py, bench/shapes.py).

A shape draws, from its seed: the architecture (qwen3moe or qwen35moe), 1-16 layers, 4-128
experts, 1-8 of them used (now and then all of them), MHA, GQA or MQA, head dims 64/128/256,
an embedding of 256-2048, one or two expert sizes (Q6_K down projections on a random set of
layers), the vocabulary and the context. Every dimension a k-quant multiplies along is a
multiple of 256, as GGUF requires; the experts are kept under MAX_EXPERT_BYTES so a sweep of
dozens runs on a laptop.
"""

from __future__ import annotations

import numpy as np

from .presets import Preset, Qwen35
from .writer import N_CALIBRATION_TOKENS

MAX_EXPERT_BYTES = 160 * 2**20
# bytes per weight of the expert parts: gate and up Q4_K, down Q5_K (Q6_K a little more)
EXPERT_BYTES_PER_WEIGHT = 2 * 144 / 256 + 176 / 256


def _attention(rng: np.random.Generator, head_dims=(64, 128, 256)) -> tuple[int, int, int]:
    """(n_head, n_head_kv, head_dim): n_head * head_dim a multiple of 256; MHA, GQA or MQA."""
    d = int(rng.choice(head_dims))
    n_head = int(rng.choice([h for h in (2, 4, 8, 16) if h * d % 256 == 0 and h * d <= 2048]))
    kind = rng.choice(["mha", "gqa", "mqa"])
    kv = n_head if kind == "mha" else 1 if kind == "mqa" else max(1, n_head // int(rng.choice([2, 4])))
    return n_head, kv, d


def shape(seed: int) -> Preset:
    """The valid model shape of `seed` (named shape<seed>)."""
    rng = np.random.default_rng([0x5A4E, seed])
    while True:
        qwen35 = rng.random() < 0.3
        n_layer = int(rng.choice([1, 2, 3, 4, 5, 6, 8, 12, 16]))
        n_expert = int(rng.choice([4, 6, 8, 12, 16, 24, 32, 64, 128]))
        used = n_expert if n_expert <= 8 and rng.random() < 0.2 else int(rng.integers(1, min(8, n_expert) + 1))
        n_embd = int(rng.choice([256, 512, 1024, 2048], p=[0.4, 0.3, 0.2, 0.1]))
        n_ff = int(rng.choice([256, 512]))
        if n_layer * n_expert * n_embd * n_ff * EXPERT_BYTES_PER_WEIGHT <= MAX_EXPERT_BYTES:
            break
    n_head, n_head_kv, head_dim = _attention(rng)
    q6k = tuple(int(i) for i in np.flatnonzero(rng.random(n_layer) < 0.3)) if rng.random() < 0.6 else ()
    common = dict(n_layer=n_layer, n_embd=n_embd, n_ff_exp=n_ff, n_expert=n_expert, n_expert_used=used,
                  n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
                  n_vocab=int(rng.choice([384, 512, 1024, 2048])), n_ctx=int(rng.choice([256, 512, 1024])),
                  q6k_down_layers=q6k,
                  # every expert routed on the 64-token calibration prompt needs picks to spare;
                  # with fewer, some experts stay unrouted, as in a real model's short prompt
                  calibrate=2 * n_expert <= N_CALIBRATION_TOKENS * used)
    if not qwen35:
        return Preset(f"shape{seed}", **common)
    v = int(rng.choice([4, 8]))
    rope = int(rng.choice([r for r in (16, 32) if r <= head_dim]))
    half = rope // 2
    sections = (half - 2 * (half // 3), half // 3, half // 3, 0)
    return Preset(f"shape{seed}", **common, bigram_lead=14.0,
                  qwen35=Qwen35(full_attention_interval=int(rng.choice([2, 3, 4])), conv_kernel=4, state_size=64,
                                group_count=int(rng.choice([g for g in (1, 2, 4) if v % g == 0])),
                                time_step_rank=v, rope_dim=rope, rope_sections=sections,
                                n_ff_shexp=int(rng.choice([256, 512]))))
