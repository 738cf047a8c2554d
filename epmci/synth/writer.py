"""Write a synthetic qwen3moe GGUF: real format and tokenizer, seeded random weights.

The file is what llama.cpp loads for a Qwen3-MoE model: standard metadata keys and tensor
names, gpt2 byte-level BPE tokenizer, F32 norms and router, K-quant / Q8_0 attention and
the production expert mix (gate/up Q4_K, down Q5_K or Q6_K). After writing, the router is
calibrated so that the calibration prompt routes to every expert of every layer.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf.quants import quantize as gguf_quantize
from gguf import GGMLQuantizationType as Q

from ..reference.quants import dequantize
from . import blocks
from .presets import GENERATOR_VERSION, TENSOR_TYPES, Preset
from .vocab import build_vocab, write_vocab

N_CALIBRATION_TOKENS = 64
# Branch gains: attention and MoE outputs small against the residual stream, and a router
# decisive enough that near-ties are rare, so quantization-rounding noise is not amplified
# layer after layer (a 1-ulp change in RoPE's cos moved the logits by 2.2 with gains of
# 0.5 / 1.0 / 2.0, by 0.4 with these).
ATTN_GAIN = 0.2
DOWN_GAIN = 0.3
ROUTER_GAIN = 6.0
OUTPUT_GAIN = 3.0
BIGRAM_LEAD = 8.0  # see _TensorPlan._embedding
RMS_EPS = 1e-6
ROPE_BASE = 1000000.0


def _rng(seed: int, name: str) -> np.random.Generator:
    """One generator per tensor, so a tensor's bytes do not depend on write order."""
    tag = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, GENERATOR_VERSION, tag])


def calibration_tokens(preset: Preset, seed: int) -> np.ndarray:
    """The 64-token prompt the router is calibrated on (ordinary tokens only)."""
    rng = _rng(seed, "calibration-prompt")
    return rng.integers(0, preset.n_vocab - 3, size=N_CALIBRATION_TOKENS).astype(np.int32)


class _TensorPlan:
    """(name, numpy-order byte shape, dtype, generator) for every tensor, in file order."""

    def __init__(self, p: Preset, seed: int):
        self.p, self.seed = p, seed
        self.items: list[tuple[str, tuple[int, ...], Q, object]] = []
        E, D, X, F = p.n_embd, p.head_dim, p.n_expert, p.n_ff_exp
        self._embedding(p)
        for i in range(p.n_layer):
            b = f"blk.{i}."
            self._norm(b + "attn_norm.weight", E)
            self._quant(b + "attn_q.weight", TENSOR_TYPES["attn_q"], (p.n_head * D,), E, E**-0.5)
            self._quant(b + "attn_k.weight", TENSOR_TYPES["attn_k"], (p.n_head_kv * D,), E, E**-0.5)
            self._quant(b + "attn_v.weight", TENSOR_TYPES["attn_v"], (p.n_head_kv * D,), E, E**-0.5)
            self._quant(b + "attn_output.weight", TENSOR_TYPES["attn_output"], (E,), p.n_head * D,
                        ATTN_GAIN * (p.n_head * D) ** -0.5)
            self._norm(b + "attn_q_norm.weight", D)
            self._norm(b + "attn_k_norm.weight", D)
            self._norm(b + "ffn_norm.weight", E)
            self._router(b + "ffn_gate_inp.weight", X, E)
            self._quant(b + "ffn_gate_exps.weight", TENSOR_TYPES["ffn_gate_exps"], (X, F), E, E**-0.5)
            self._quant(b + "ffn_up_exps.weight", TENSOR_TYPES["ffn_up_exps"], (X, F), E, E**-0.5)
            self._quant(b + "ffn_down_exps.weight", p.down_type(i), (X, E), F, DOWN_GAIN * F**-0.5)
        self._norm("output_norm.weight", E)
        self._quant("output.weight", TENSOR_TYPES["output"], (p.n_vocab,), E, OUTPUT_GAIN * E**-0.5)

    def _embedding(self, p: Preset):
        """Token embeddings with a bigram-like pull towards one output row each.

        With purely random weights the next-token distribution is nearly flat, so float
        summation-order noise (~0.3 logits after 8 quantized layers, measured against
        llama.cpp) flips the argmax at ~5% of positions and greedy decoding is a coin toss.
        Real LMs are decisive; here each token's embedding leans towards the output row of
        a seeded "next token" (BIGRAM_LEAD output-logit standard deviations before the
        layers dilute it; measured median top-1 lead 8.5 logits, 5% quantile 1.5), so
        float noise cannot flip it. The rest of the distribution still depends on the
        whole context, which is what KL against a reference measures.
        """
        name, E = "token_embd.weight", p.n_embd
        qtype = TENSOR_TYPES["token_embd"]

        def make():
            out_rows = blocks.random_rows(_rng(self.seed, "output.weight"), TENSOR_TYPES["output"],
                                          p.n_vocab, E, OUTPUT_GAIN * E**-0.5)
            out = dequantize(out_rows, TENSOR_TYPES["output"]).astype(np.float64)
            rng = _rng(self.seed, name)
            nxt = rng.integers(0, p.n_vocab - 3, size=p.n_vocab)  # ordinary tokens only
            pull = out[nxt] / np.linalg.norm(out[nxt], axis=1, keepdims=True) * np.sqrt(E)
            beta = BIGRAM_LEAD / np.sqrt(E)
            emb = rng.standard_normal((p.n_vocab, E)) + beta * pull
            return gguf_quantize(emb.astype(np.float32), qtype)
        block, size = GGML_QUANT_SIZES[qtype]
        self.items.append((name, (p.n_vocab, E // block * size), qtype, make))

    def _quant(self, name, qtype, rows_shape, cols, std):
        block, size = GGML_QUANT_SIZES[qtype]
        n_rows = int(np.prod(rows_shape))

        def make():
            rows = blocks.random_rows(_rng(self.seed, name), qtype, n_rows, cols, std)
            return rows.reshape(*rows_shape, cols // block * size)
        self.items.append((name, (*rows_shape, cols // block * size), qtype, make))

    def _router(self, name, n_expert, n_embd):
        p = self.p

        def make():
            w = _rng(self.seed, name).standard_normal((n_expert, n_embd)) * (ROUTER_GAIN * n_embd**-0.5)
            if p.routing_skew:
                rank = _rng(self.seed, name + ".popularity").permutation(n_expert)
                s = (rank + 1.0) ** -p.routing_skew
                w = w * (s / np.sqrt(np.mean(s * s)))[:, None]
            return w.astype(np.float32)
        self.items.append((name, (n_expert, n_embd), Q.F32, make))

    def _norm(self, name, n):
        def make():
            return (1.0 + 0.1 * _rng(self.seed, name).standard_normal(n)).astype(np.float32)
        self.items.append((name, (n,), Q.F32, make))


def _write_metadata(w: GGUFWriter, p: Preset, seed: int) -> None:
    w.add_name(f"epmci-synthetic-{p.name}-seed{seed}")
    w.add_uint32("epmci.generator_version", GENERATOR_VERSION)
    w.add_uint32("epmci.seed", seed)
    w.add_string("epmci.preset", p.name)
    w.add_block_count(p.n_layer)
    w.add_context_length(p.n_ctx)
    w.add_embedding_length(p.n_embd)
    w.add_feed_forward_length(4 * p.n_embd)  # dense FFN size: unused by qwen3moe, but a standard key
    w.add_expert_feed_forward_length(p.n_ff_exp)
    w.add_head_count(p.n_head)
    w.add_head_count_kv(p.n_head_kv)
    w.add_key_length(p.head_dim)
    w.add_value_length(p.head_dim)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_expert_count(p.n_expert)
    w.add_expert_used_count(p.n_expert_used)
    w.add_file_type(15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    write_vocab(w, build_vocab(p.n_vocab))


def write_model(p: Preset, seed: int, out: str | os.PathLike) -> Path:
    """Write the model to `out` atomically (temp file in the same folder, then rename)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        plan = _TensorPlan(p, seed)
        w = GGUFWriter(tmp, "qwen3moe")
        _write_metadata(w, p, seed)
        for name, shape, qtype, _ in plan.items:
            dtype = np.float32 if qtype == Q.F32 else np.uint8
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            w.add_tensor_info(name, shape, np.dtype(dtype), nbytes,
                              raw_dtype=None if qtype == Q.F32 else qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for _, _, _, make in plan.items:
            w.write_tensor_data(make())
        w.close()
        if p.calibrate:
            from .calibrate import calibrate_router
            calibrate_router(tmp, calibration_tokens(p, seed))
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
