"""Synthetic model presets: qwen3moe shapes and the quant mix of the production model."""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

# Bump when the bytes a preset + seed produce change; part of the cache key.
GENERATOR_VERSION = 2


@dataclass(frozen=True)
class Preset:
    name: str
    n_layer: int
    n_embd: int
    n_ff_exp: int
    n_expert: int
    n_expert_used: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx: int
    calibrate: bool = True  # make the router use every expert on the calibration prompt
    # Expert popularity: router row e of a layer is scaled by (1 + rank(e))^-routing_skew
    # (ranks a seeded permutation per layer, RMS kept), so a few experts win most lookups,
    # as in trained MoEs. 0 = uniform random routing, the worst case for a cache.
    routing_skew: float = 0.0

    def down_type(self, layer: int) -> Q:
        """Q5_K down on most layers, Q6_K on a lone middle-late layer and the last one,
        as the production model (Q6_K on 34, 38, 39 of 40) -- so experts come in two sizes."""
        n = self.n_layer
        return Q.Q6_K if layer in (n - 1, n - 3) else Q.Q5_K


# Per-tensor quant types outside the experts: K-quants for attention, Q8_0 for the key
# projection and the embedding (so the Q8_0 x Q8_0 path is exercised), Q6_K head.
TENSOR_TYPES = {
    "token_embd": Q.Q8_0,
    "output": Q.Q6_K,
    "attn_q": Q.Q4_K,
    "attn_k": Q.Q8_0,
    "attn_v": Q.Q6_K,
    "attn_output": Q.Q5_K,
    "ffn_gate_exps": Q.Q4_K,
    "ffn_up_exps": Q.Q4_K,
}

PRESETS = {
    p.name: p
    for p in (
        Preset("tiny", n_layer=4, n_embd=256, n_ff_exp=256, n_expert=8, n_expert_used=2,
               n_head=4, n_head_kv=2, head_dim=64, n_vocab=384, n_ctx=256),
        Preset("ci", n_layer=8, n_embd=512, n_ff_exp=256, n_expert=64, n_expert_used=4,
               n_head=8, n_head_kv=4, head_dim=64, n_vocab=1024, n_ctx=1024),
        # ci with skewed routing (the 8 hottest of 64 experts take about half the lookups):
        # for cache-policy experiments (hot pins, admission, LRU vs MIN), not for the gate.
        Preset("ci-skew", n_layer=8, n_embd=512, n_ff_exp=256, n_expert=64, n_expert_used=4,
               n_head=8, n_head_kv=4, head_dim=64, n_vocab=1024, n_ctx=1024, routing_skew=0.5),
        # Qwen3-30B-A3B's layer shape, 8 layers: ~2.9 GB of experts.
        Preset("bench", n_layer=8, n_embd=2048, n_ff_exp=768, n_expert=128, n_expert_used=8,
               n_head=32, n_head_kv=4, head_dim=128, n_vocab=4096, n_ctx=2048),
    )
}
