"""The qwen35moe forward pass (Qwen3.5/3.6-35B-A3B's language model), in the order of
llama.cpp's graph (src/models/qwen35moe.cpp, src/models/delta-net-base.cpp;
docs/qwen35moe.md; docs/engine-contract.md):

    x = token_embd[tokens]
    per layer:  h = rms_norm(x) * attn_norm
                a = gated_delta_net(h) if the layer is recurrent else gated_attention(h)
                x = a + x
                u = rms_norm(x) * post_attention_norm
                x = (routed_experts(u) + shared_expert(u)) + x
    logits = output . (rms_norm(x) * output_norm)

Numerics are the reference's (epmci/reference/qwen35moe.py, deltanet.py), i.e. ggml's CPU
backend: activations quantized per weight type, RMSNorm with float32 squares, an F16 KV
cache with flash attention off, the delta net's state in F32 (engine/deltanet.py).

What a micro-batch leaves for the next one (and prefill for decode): each attention layer's
K/V rows in its cache (only attention layers have one), each delta-net layer's conv window
and recurrent matrix. Routed experts come from the ExpertStore exactly as in qwen3moe
(Model.moe: paged or resident); the shared expert is a dense weight, resident like the
attention weights.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from . import deltanet
from . import kernels as K
from . import ops
from .gguf_model import GGUFModel, HParams
from .kernels import Activation
from .model import ExpertStore, Model, experts_ffn, kv_cache_bytes
from .qwen35_ops import l2_norm_heads, rms_norm, rms_norm_heads, rope_cache, sigmoid, silu, softplus
from .traces import Qwen35Trace, StateTrace

F32 = np.float32


def attention_layers(hp: HParams) -> list[int]:
    return [il for il in range(hp.n_layer) if not hp.is_recurrent(il)]


def state_bytes(hp: HParams, n_ctx: int) -> int:
    """What the forward keeps between micro-batches: the attention layers' KV cache and every
    delta-net layer's conv window and recurrent matrix (F32)."""
    s = hp.ssm
    per_deltanet = 4 * (s.conv_dim * (s.conv_kernel - 1) + s.time_step_rank * s.state_size ** 2)
    n_attn = len(attention_layers(hp))
    return kv_cache_bytes(replace(hp, n_layer=n_attn), n_ctx) + (hp.n_layer - n_attn) * per_deltanet


class Qwen35Model(Model):
    """The forward pass above; the routed experts (routing, paging, the weighted sum, the
    MoE trace) are Model's."""
    rms_norm = staticmethod(rms_norm)

    def __init__(self, gm: GGUFModel, experts: ExpertStore, n_ctx: int):
        # the attention layers' KV cache slots, which Model.__init__ shapes the cache by
        self.kv_slot = {il: a for a, il in enumerate(attention_layers(gm.hp))}
        self._shared_out: np.ndarray | None = None
        super().__init__(gm, experts, n_ctx)
        hp, s = self.hp, gm.hp.ssm
        self._shared_types = [tuple(int(gm.layer(il, f"ffn_{p}_shexp").qtype) for p in ("gate", "up", "down"))
                              for il in range(hp.n_layer)]
        deltanets = [il for il in range(hp.n_layer) if hp.is_recurrent(il)]
        self.conv_state = {il: np.zeros((s.conv_dim, s.conv_kernel - 1), F32) for il in deltanets}
        # [j, i, m] = S_j[i][m]; the trace carries llama.cpp's [j, m, i] (engine/deltanet.py)
        self.ssm_state = {il: np.zeros((s.time_step_rank, s.state_size, s.state_size), F32) for il in deltanets}
        self.on_state: Callable[[StateTrace], None] | None = None

    def cached_layers(self) -> HParams:
        """Only the attention layers keep a KV cache."""
        return replace(self.hp, n_layer=len(self.kv_slot))

    # Model.moe emits the routed experts' MoETrace; a qwen35moe trace adds the layer's shared
    # expert output, which the forward computes just before the routed experts.
    @property
    def on_moe(self):
        return self._trace

    @on_moe.setter
    def on_moe(self, fn: Callable[[Qwen35Trace], None] | None) -> None:
        self._trace = None if fn is None else (lambda t: fn(Qwen35Trace(**vars(t), shared=self._shared_out)))

    def forward(self, tokens: np.ndarray, logits_rows: int | None = None) -> np.ndarray:
        """Evaluate a micro-batch of tokens at positions n_past..; returns the logits of its
        last `logits_rows` positions (None: all n), (rows, n_vocab)."""
        hp, s = self.hp, self.hp.ssm
        tokens = np.asarray(tokens, dtype=np.int64)
        n, D, H, Hkv, p0 = len(tokens), hp.head_dim, hp.n_head, hp.n_head_kv, self.n_past
        if p0 + n > self.n_ctx:
            raise ValueError(f"context full: {p0 + n} tokens > n_ctx {self.n_ctx}")
        V, G, ds, kd = s.time_step_rank, s.group_count, s.state_size, s.key_dim
        R, eps = hp.rope_dim, hp.rms_eps
        cos, sin = rope_cache(np.arange(p0, p0 + n), R, hp.rope_base, hp.rope_sections)
        kq_scale = F32(1) / np.sqrt(F32(D))
        ssm_scale = F32(1) / np.sqrt(F32(ds))
        emb, emb_type = self._w["token_embd.weight"]
        x = K.dequantize_rows(np.ascontiguousarray(emb[tokens]), emb_type)

        for il in range(hp.n_layer):
            b = f"blk.{il}."
            self.experts.begin_layer(il, x)
            h = Activation(rms_norm(x, self._vec(b + "attn_norm.weight"), eps))

            if hp.is_recurrent(il):
                # gated delta net: projections, decay, causal conv, l2-normed q/k, recurrence
                qkv = self._mm(b + "attn_qkv.weight", h)
                z = self._mm(b + "attn_gate.weight", h)
                beta = sigmoid(self._mm(b + "ssm_beta.weight", h))
                alpha = self._mm(b + "ssm_alpha.weight", h)
                g = (softplus(alpha + self._vec(b + "ssm_dt.bias")) * self._vec(b + "ssm_a")).astype(F32)
                y = silu(deltanet.causal_conv(qkv, self.conv_state[il], self._vec(b + "ssm_conv1d.weight")))
                q = l2_norm_heads(y[:, :kd].reshape(n, G, ds), eps)
                k = l2_norm_heads(y[:, kd:2 * kd].reshape(n, G, ds), eps)
                v = np.ascontiguousarray(y[:, 2 * kd:]).reshape(n, V, ds)
                o = deltanet.gated_delta_rule(q, k, v, np.exp(g), beta, self.ssm_state[il], ssm_scale)
                if self.on_state is not None:
                    self.on_state(StateTrace(il, p0, n, self.conv_state[il].copy(),
                                             self.ssm_state[il].transpose(0, 2, 1).copy()))
                # gated norm per value head, then the output projection
                o = rms_norm_heads(o, self._vec(b + "ssm_norm.weight"), eps) * silu(z.reshape(n, V, ds))
                a = self._mm(b + "ssm_out.weight", o.reshape(n, V * ds))
            else:
                # gated attention: query and gate interleaved per head in attn_q
                qg = self._mm(b + "attn_q.weight", h).reshape(n, H, 2, D)
                k = self._mm(b + "attn_k.weight", h).reshape(n, Hkv, D)
                v = self._mm(b + "attn_v.weight", h).reshape(n, Hkv, D)
                q = rms_norm_heads(qg[:, :, 0], self._vec(b + "attn_q_norm.weight"), eps)
                k = rms_norm_heads(k, self._vec(b + "attn_k_norm.weight"), eps)
                ops.rope_neox(q[:, :, :R], cos, sin)   # in place, the first R dims only
                ops.rope_neox(k[:, :, :R], cos, sin)
                kv = self.kv_slot[il]
                self.k_cache[kv, :, :, p0:p0 + n] = ops.round_f16(k).transpose(1, 2, 0)
                self.v_cache[kv, p0:p0 + n] = ops.round_f16(v)
                p = ops.attention_probs(ops.round_f16(q), self.k_cache[kv], p0, kq_scale)
                attn = ops.attention_values(ops.round_f16(p), self.v_cache[kv, :p0 + n])
                a = self._mm(b + "attn_output.weight", attn * sigmoid(qg[:, :, 1].reshape(n, H * D)))
            x = (a + x).astype(F32)

            # routed experts (paged) + shared expert (resident, behind a sigmoid gate),
            # the shared one computed while the routed experts' reads are under way
            u = rms_norm(x, self._vec(b + "post_attention_norm.weight"), eps)
            routed = self.moe_request(il, u)
            self._shared_out = self.shared_expert(il, u)
            x = ((self.moe_output(routed) + self._shared_out) + x).astype(F32)

        self.experts.end_batch(n)
        self.n_past += n
        return self.logits(x, logits_rows)

    def shared_expert(self, il: int, u: np.ndarray) -> np.ndarray:
        """down(silu(gate u) * up u) * sigmoid(ffn_gate_inp_shexp . u), one gate per row."""
        b = f"blk.{il}."
        parts = [self._vec(b + f"ffn_{p}_shexp.weight") for p in ("gate", "up", "down")]
        a = Activation(u)
        y = experts_ffn([tuple(parts)], self._shared_types[il], a, [np.arange(len(u))])
        gate_w, gate_type = self._w[b + "ffn_gate_inp_shexp.weight"]
        return (y * sigmoid(K.matmul(gate_w.reshape(1, -1), gate_type, a))).astype(F32)
