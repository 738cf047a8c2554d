"""Synthetic model presets: qwen3moe and qwen35moe shapes, the quant mix of the production model."""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

# Bump when the bytes a preset + seed produce change; part of the cache key and the model id.
# One version per architecture, so a change to one family's generator leaves the other's
# files (and the golden baselines recorded on them) as they are.
GENERATOR_VERSION = 2          # qwen3moe
QWEN35_GENERATOR_VERSION = 1   # qwen35moe


@dataclass(frozen=True)
class Qwen35:
    """What a qwen35moe preset adds to the qwen3moe shape (docs/qwen35moe.md).

    Layer i is full (gated) attention when (i + 1) % full_attention_interval == 0, else a
    Gated DeltaNet layer; every layer has a shared expert of n_ff_shexp beside the routed ones.
    """
    full_attention_interval: int
    conv_kernel: int        # Kc, taps of the causal conv1d
    state_size: int         # ds, head dim of the delta net's q, k and v
    group_count: int        # G, q/k heads of the delta net
    time_step_rank: int     # V, value heads (V % G == 0); ssm.inner_size = ds * V
    rope_dim: int           # R <= head_dim: partial rotary
    rope_sections: tuple[int, int, int, int]
    n_ff_shexp: int

    def is_recurrent(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval != 0


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
    qwen35: Qwen35 | None = None  # None: a qwen3moe model
    rope_base: float = 1000000.0
    # How far each token's embedding leans towards its seeded next token, in output-logit
    # standard deviations (writer.TensorPlan._embedding). The qwen35moe presets need more:
    # their delta nets carry more of the context, and with 8.0 a few positions of the
    # calibration prompt had top-1 leads of 0.02-0.06 logits, against float-order noise of
    # ~0.1 versus llama.cpp; with 14.0 the smallest lead over 128 positions is 1.2 (tiny35)
    # and 2.4 (ci35), the median 19.
    bigram_lead: float = 8.0
    # Layers whose experts' down projection is Q6_K (the larger expert size); None: the
    # last layer and the third from last.
    q6k_down_layers: tuple[int, ...] | None = None

    @property
    def arch(self) -> str:
        return "qwen3moe" if self.qwen35 is None else "qwen35moe"

    @property
    def generator_version(self) -> int:
        return GENERATOR_VERSION if self.qwen35 is None else QWEN35_GENERATOR_VERSION

    def down_type(self, layer: int) -> Q:
        """Q5_K down on most layers, Q6_K on a few late ones, as the production model (Q6_K
        on 34, 38, 39 of 40) -- so experts come in two sizes."""
        n = self.n_layer
        q6k = self.q6k_down_layers if self.q6k_down_layers is not None else (n - 1, n - 3)
        return Q.Q6_K if layer in q6k else Q.Q5_K


# Per-tensor quant types outside the experts: K-quants for attention, Q8_0 for the key
# projection and the embedding (so the Q8_0 x Q8_0 path is exercised), Q6_K head.
# qwen35moe adds the delta net's projections (ssm_alpha in F32: it sets the decay rate),
# and the shared expert with the routed experts' mix. Norms, routers, ssm_a, ssm_dt.bias,
# ssm_conv1d and the shared-expert gate are F32 (llama.cpp requires or keeps them so).
TENSOR_TYPES = {
    "token_embd": Q.Q8_0,
    "output": Q.Q6_K,
    "attn_q": Q.Q4_K,
    "attn_k": Q.Q8_0,
    "attn_v": Q.Q6_K,
    "attn_output": Q.Q5_K,
    "ffn_gate_exps": Q.Q4_K,
    "ffn_up_exps": Q.Q4_K,
    "attn_qkv": Q.Q5_K,
    "attn_gate": Q.Q4_K,
    "ssm_beta": Q.Q8_0,
    "ssm_alpha": Q.F32,
    "ssm_out": Q.Q5_K,
    "ffn_gate_shexp": Q.Q4_K,
    "ffn_up_shexp": Q.Q4_K,
    "ffn_down_shexp": Q.Q5_K,
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
        # qwen35moe: layers 0-2 Gated DeltaNet, 3 full attention.
        Preset("tiny35", n_layer=4, n_embd=256, n_ff_exp=256, n_expert=8, n_expert_used=2,
               n_head=4, n_head_kv=2, head_dim=64, n_vocab=384, n_ctx=256, bigram_lead=14.0,
               qwen35=Qwen35(full_attention_interval=4, conv_kernel=4, state_size=64, group_count=2,
                             time_step_rank=4, rope_dim=16, rope_sections=(3, 3, 2, 0), n_ff_shexp=256)),
        # The gate's qwen35moe model: 6 GDN + 2 attention layers (3 and 7), 64 experts, 8 used.
        Preset("ci35", n_layer=8, n_embd=512, n_ff_exp=256, n_expert=64, n_expert_used=8,
               n_head=8, n_head_kv=2, head_dim=128, n_vocab=1024, n_ctx=1024, bigram_lead=14.0,
               qwen35=Qwen35(full_attention_interval=4, conv_kernel=4, state_size=64, group_count=4,
                             time_step_rank=8, rope_dim=32, rope_sections=(6, 5, 5, 0), n_ff_shexp=256)),
        # Qwen3.5-35B-A3B's per-layer shape (expert sizes 1,900,544 / 2,039,808 B, as the
        # production model's), 8 of its 40 layers and a 4096-token vocabulary: ~4 GB.
        # Made only on request (`epmci model make prod35`).
        Preset("prod35", n_layer=8, n_embd=2048, n_ff_exp=512, n_expert=256, n_expert_used=8,
               n_head=16, n_head_kv=2, head_dim=256, n_vocab=4096, n_ctx=4096, rope_base=10000000.0,
               bigram_lead=14.0, qwen35=Qwen35(full_attention_interval=4, conv_kernel=4, state_size=128, group_count=16,
                             time_step_rank=32, rope_dim=64, rope_sections=(11, 11, 10, 0), n_ff_shexp=512)),
        # The production model's full shape: 40 layers (30 Gated DeltaNet + 10 attention),
        # Q6_K down on layers 34, 38 and 39, a 248,320-token vocabulary, 4096 context:
        # ~21.5 GB. Made only on request, never by the test suite.
        Preset("prod35-full", n_layer=40, n_embd=2048, n_ff_exp=512, n_expert=256, n_expert_used=8,
               n_head=16, n_head_kv=2, head_dim=256, n_vocab=248320, n_ctx=4096, rope_base=10000000.0,
               bigram_lead=14.0, q6k_down_layers=(34, 38, 39),
               qwen35=Qwen35(full_attention_interval=4, conv_kernel=4, state_size=128, group_count=16,
                             time_step_rank=32, rope_dim=64, rope_sections=(11, 11, 10, 0), n_ff_shexp=512)),
    )
}
