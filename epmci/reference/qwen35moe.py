"""Reference whole-model forward for qwen35moe (Qwen3.5/3.6-35B-A3B's language model), in
the order of llama.cpp's graph (llama_model_qwen35moe::graph::graph, src/models/qwen35moe.cpp;
docs/qwen35moe.md):

    x = token_embd[tokens]
    per layer:  h = rms_norm(x) * attn_norm
                a = deltanet_layer(h) if the layer is recurrent else gated_attention(h)
                x = a + x
                u = rms_norm(x) * post_attention_norm
                x = (moe(u) + shared_expert(u)) + x
    logits = output . (rms_norm(x) * output_norm)

Numerics are ggml's CPU backend's, as in the qwen3moe reference (model.py): activations
quantized to each weight's vec_dot type, F32 weights' products summed in double, RMSNorm
with float32 squares summed in double (ops.rms_norm), an F16 KV cache with flash attention
off (Q, K, V and the probabilities rounded to f16), the delta net's state in F32
(deltanet.py). The gated attention (build_layer_attn):

- attn_q gives 2*D values per head, query then gate, interleaved per head;
- q and k RMS-normed per head (attn_q_norm, attn_k_norm), then IMROPE over the first
  rope_dim dims with NEOX pairing and multi-section positions (ops.rope_neox); v not normed;
- causal GQA attention, then o * sigmoid(gate) (head-major), then attn_output.

The whole prompt is one sequence from its start; the delta nets' state can be read after
any position (Forward.states).
"""

from __future__ import annotations

import numpy as np

from .deltanet import DeltaNetState, deltanet_layer
from .model import Forward, MoEHook, ReferenceModel
from .moe import moe_layer, shared_expert
from .ops import attention, rms_norm, rope_neox, sigmoid


class Qwen35Model(ReferenceModel):
    square = np.float32   # RMSNorm as ggml: float32 squares
    moe_norm = "post_attention_norm.weight"

    def gated_attention(self, il: int, h: np.ndarray, pos: np.ndarray) -> np.ndarray:
        hp, b = self.hp, f"blk.{il}."
        n, D, H = h.shape[0], hp.head_dim, hp.n_head
        qg = self._mm(b + "attn_q.weight", h).reshape(n, H, 2, D)
        q, gate = qg[:, :, 0], qg[:, :, 1].reshape(n, H * D)
        k = self._mm(b + "attn_k.weight", h).reshape(n, hp.n_head_kv, D)
        v = self._mm(b + "attn_v.weight", h).reshape(n, hp.n_head_kv, D)
        q = rms_norm(q, hp.rms_eps) * self._f32(b + "attn_q_norm.weight")
        k = rms_norm(k, hp.rms_eps) * self._f32(b + "attn_k_norm.weight")
        q = rope_neox(q, pos, hp.rope_base, hp.rope_dim, hp.rope_sections)
        k = rope_neox(k, pos, hp.rope_base, hp.rope_dim, hp.rope_sections)
        o = (attention(q, k, v) * sigmoid(gate)).astype(np.float32)
        return self._mm(b + "attn_output.weight", o)

    def forward(self, tokens, moe_hook: MoEHook | None = None, state_after=()) -> Forward:
        """Logits and per-layer values for every position of `tokens`, from the sequence
        start. `moe_hook(layer, u)` runs before each layer's routing. Forward.states holds
        every delta-net layer's state after the last position and after each position in
        `state_after`."""
        hp, tokens = self.hp, np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        pos = np.arange(n)
        keep = {int(p) for p in state_after if 0 <= int(p) < n}
        result = Forward(logits=np.empty(0))
        result.states = {p: {} for p in sorted(keep | {n - 1})}
        x = self.embed(tokens)
        for il in range(hp.n_layer):
            b = f"blk.{il}."
            h = (rms_norm(x, hp.rms_eps) * self._f32(b + "attn_norm.weight")).astype(np.float32)
            if hp.is_recurrent(il):
                r = deltanet_layer(self.mf, il, h, DeltaNetState.zeros(hp.ssm), keep)
                for p, st in [*r.states.items(), (n - 1, r.state)]:
                    result.states[p][il] = st
                a = r.out
            else:
                a = self.gated_attention(il, h, pos)
            x = (a + x).astype(np.float32)

            u = self.moe_input(il, x)
            if moe_hook is not None:
                moe_hook(il, u)
            moe = moe_layer(self.mf, il, u)
            shared = shared_expert(self.mf, il, u)
            x = ((moe.out + shared) + x).astype(np.float32)
            result.add_layer(a, u, moe, x, shared)

        result.logits = self.head(x)
        return result
