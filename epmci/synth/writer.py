"""Write a synthetic qwen3moe or qwen35moe GGUF: real format and tokenizer, seeded random weights.

The file is what llama.cpp loads for a Qwen3-MoE (qwen3moe) or Qwen3.5-MoE (qwen35moe)
model: standard metadata keys and tensor names, gpt2 byte-level BPE tokenizer, F32 norms
and router, K-quant / Q8_0 attention and the production expert mix (gate/up Q4_K, down Q5_K
or Q6_K). qwen35moe adds Gated DeltaNet layers, gated attention and a shared expert
(docs/qwen35moe.md: metadata, tensors). After writing, the router is calibrated so
that the calibration prompt routes to every expert of every layer.
"""

from __future__ import annotations

import glob
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf.quants import quantize as gguf_quantize
from gguf import GGMLQuantizationType as Q

from ..reference.quants import dequantize
from . import blocks
from .presets import TENSOR_TYPES, Preset
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
RMS_EPS = 1e-6
# qwen35moe's delta net, drawn as the HF model initialises it: a decay rate A in [1, 16]
# (ssm_a = -A), a time step dt = softplus(dt_bias) log-uniform in [1e-3, 1e-1], so
# exp(g) = exp(-A dt) keeps between 0.2 and 0.999 of the state per token.
SSM_A_RANGE = (1.0, 16.0)
SSM_DT_RANGE = (1e-3, 1e-1)
ALPHA_GAIN = 0.5   # alpha = W_alpha h ~ N(0, 0.25): dt varies per token around dt_bias
CONV_STD = 0.5
# qwen35moe's gated attention: with q/k norm weights ~1, random attention is nearly uniform
# and position errors hardly show (KL vs llama.cpp 5e-5 on tiny35 with RoPE's NEOX pairs
# swapped for adjacent ones). q/k norm weights ~2.5 make the scores peaked (that KL:
# 3.4e-4, against 4e-9 when right); the output gain then keeps the attention output as
# large as the delta nets' (RMS ~0.14 both), since peaked attention no longer averages
# its values down and noise from float order grows with it (ci35: KL 9e-6 at gain 0.6).
GATED_ATTN_GAIN = 0.3
QK_NORM_SCALE = 2.5
EMBEDDING_SLICE_ROWS = 16384


def _rng(seed: int, name: str, version: int) -> np.random.Generator:
    """One generator per tensor, so a tensor's bytes do not depend on write order."""
    tag = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, version, tag])


def calibration_tokens(preset: Preset, seed: int) -> np.ndarray:
    """The 64-token prompt the router is calibrated on (ordinary tokens only)."""
    rng = _rng(seed, "calibration-prompt", preset.generator_version)
    return rng.integers(0, preset.n_vocab - 3, size=N_CALIBRATION_TOKENS).astype(np.int32)


class TensorPlan:
    """(name, numpy-order byte shape, dtype, generator) for every tensor, in file order."""

    def __init__(self, p: Preset, seed: int):
        self.p, self.seed = p, seed
        self.version = p.generator_version
        self.items: list[tuple[str, tuple[int, ...], Q, object]] = []
        E = p.n_embd
        self._embedding(p)
        for i in range(p.n_layer):
            b = f"blk.{i}."
            if p.qwen35 is None:
                self._norm(b + "attn_norm.weight", E)
                self._attention(b, q_rows=p.n_head * p.head_dim)
                self._norm(b + "ffn_norm.weight", E)
                self._experts(b, i)
            else:
                self._norm(b + "attn_norm.weight", E)
                if p.qwen35.is_recurrent(i):
                    self._deltanet(b)
                else:   # the query and its gate, interleaved per head
                    self._attention(b, q_rows=2 * p.n_head * p.head_dim, gain=GATED_ATTN_GAIN,
                                    qk_norm=QK_NORM_SCALE)
                self._norm(b + "post_attention_norm.weight", E)
                self._experts(b, i)
                self._shared_expert(b)
        self._norm("output_norm.weight", E)
        self._quant("output.weight", TENSOR_TYPES["output"], (p.n_vocab,), E, OUTPUT_GAIN * E**-0.5)

    def _attention(self, b: str, q_rows: int, gain: float = ATTN_GAIN, qk_norm: float = 1.0):
        p, E, D = self.p, self.p.n_embd, self.p.head_dim
        self._quant(b + "attn_q.weight", TENSOR_TYPES["attn_q"], (q_rows,), E, E**-0.5)
        self._quant(b + "attn_k.weight", TENSOR_TYPES["attn_k"], (p.n_head_kv * D,), E, E**-0.5)
        self._quant(b + "attn_v.weight", TENSOR_TYPES["attn_v"], (p.n_head_kv * D,), E, E**-0.5)
        self._quant(b + "attn_output.weight", TENSOR_TYPES["attn_output"], (E,), p.n_head * D,
                    gain * (p.n_head * D) ** -0.5)
        self._norm(b + "attn_q_norm.weight", D, qk_norm)
        self._norm(b + "attn_k_norm.weight", D, qk_norm)

    def _experts(self, b: str, layer: int):
        p, E, X, F = self.p, self.p.n_embd, self.p.n_expert, self.p.n_ff_exp
        self._router(b + "ffn_gate_inp.weight", X, E)
        self._quant(b + "ffn_gate_exps.weight", TENSOR_TYPES["ffn_gate_exps"], (X, F), E, E**-0.5)
        self._quant(b + "ffn_up_exps.weight", TENSOR_TYPES["ffn_up_exps"], (X, F), E, E**-0.5)
        self._quant(b + "ffn_down_exps.weight", p.down_type(layer), (X, E), F, DOWN_GAIN * F**-0.5)

    def _deltanet(self, b: str):
        """A Gated DeltaNet layer's tensors (llama_model_qwen35moe::load_arch_tensors)."""
        q, E = self.p.qwen35, self.p.n_embd
        V, ds = q.time_step_rank, q.state_size
        conv_dim = 2 * ds * q.group_count + ds * V
        self._quant(b + "attn_qkv.weight", TENSOR_TYPES["attn_qkv"], (conv_dim,), E, E**-0.5)
        self._quant(b + "attn_gate.weight", TENSOR_TYPES["attn_gate"], (ds * V,), E, E**-0.5)
        self._f32(b + "ssm_conv1d.weight", (conv_dim, q.conv_kernel),
                  lambda r: CONV_STD * r.standard_normal((conv_dim, q.conv_kernel)))
        self._f32(b + "ssm_dt.bias", (V,),
                  lambda r: np.log(np.expm1(np.exp(r.uniform(*np.log(SSM_DT_RANGE), size=V)))))
        self._f32(b + "ssm_a", (V,), lambda r: -r.uniform(*SSM_A_RANGE, size=V))
        self._quant(b + "ssm_beta.weight", TENSOR_TYPES["ssm_beta"], (V,), E, E**-0.5)
        self._f32(b + "ssm_alpha.weight", (V, E), lambda r: ALPHA_GAIN * E**-0.5 * r.standard_normal((V, E)))
        self._norm(b + "ssm_norm.weight", ds)
        self._quant(b + "ssm_out.weight", TENSOR_TYPES["ssm_out"], (E,), ds * V, ATTN_GAIN * (ds * V) ** -0.5)

    def _shared_expert(self, b: str):
        E, Fs = self.p.n_embd, self.p.qwen35.n_ff_shexp
        self._f32(b + "ffn_gate_inp_shexp.weight", (E,), lambda r: E**-0.5 * r.standard_normal(E))
        self._quant(b + "ffn_gate_shexp.weight", TENSOR_TYPES["ffn_gate_shexp"], (Fs,), E, E**-0.5)
        self._quant(b + "ffn_up_shexp.weight", TENSOR_TYPES["ffn_up_shexp"], (Fs,), E, E**-0.5)
        self._quant(b + "ffn_down_shexp.weight", TENSOR_TYPES["ffn_down_shexp"], (E,), Fs, DOWN_GAIN * Fs**-0.5)

    def _embedding(self, p: Preset):
        """Token embeddings with a bigram-like pull towards one output row each.

        With purely random weights the next-token distribution is nearly flat, so float
        summation-order noise (~0.3 logits after 8 quantized layers, measured against
        llama.cpp) flips the argmax at ~5% of positions and greedy decoding is a coin toss.
        Real LMs are decisive; here each token's embedding leans towards the output row of
        a seeded "next token" (Preset.bigram_lead output-logit standard deviations before
        the layers dilute it; 8.0 on ci: median top-1 lead 8.5 logits, 5% quantile 1.5),
        so float noise cannot flip it. The rest of the distribution still depends on the
        whole context, which is what KL against a reference measures.
        """
        name, E = "token_embd.weight", p.n_embd
        qtype = TENSOR_TYPES["token_embd"]

        def make():
            out_rows = blocks.random_rows(self._rng("output.weight"), TENSOR_TYPES["output"],
                                          p.n_vocab, E, OUTPUT_GAIN * E**-0.5)
            rng = self._rng(name)
            nxt = rng.integers(0, p.n_vocab - 3, size=p.n_vocab)  # ordinary tokens only
            beta = p.bigram_lead / np.sqrt(E)
            # In slices of rows: float64 copies of a 248k-token vocabulary would take ~4 GB
            # each. The generator yields the same normals sliced or whole, so the bytes do
            # not depend on the slice size.
            parts = []
            for lo in range(0, p.n_vocab, EMBEDDING_SLICE_ROWS):
                out = dequantize(out_rows[nxt[lo:lo + EMBEDDING_SLICE_ROWS]],
                                 TENSOR_TYPES["output"]).astype(np.float64)
                pull = out / np.linalg.norm(out, axis=1, keepdims=True) * np.sqrt(E)
                emb = rng.standard_normal(out.shape) + beta * pull
                parts.append(gguf_quantize(emb.astype(np.float32), qtype))
            return np.concatenate(parts)
        block, size = GGML_QUANT_SIZES[qtype]
        self.items.append((name, (p.n_vocab, E // block * size), qtype, make))

    def _quant(self, name, qtype, rows_shape, cols, std):
        block, size = GGML_QUANT_SIZES[qtype]
        n_rows = int(np.prod(rows_shape))

        def make():
            rows = blocks.random_rows(self._rng(name), qtype, n_rows, cols, std)
            return rows.reshape(*rows_shape, cols // block * size)
        self.items.append((name, (*rows_shape, cols // block * size), qtype, make))

    def _router(self, name, n_expert, n_embd):
        p = self.p

        def make():
            w = self._rng(name).standard_normal((n_expert, n_embd)) * (ROUTER_GAIN * n_embd**-0.5)
            if p.routing_skew:
                rank = self._rng(name + ".popularity").permutation(n_expert)
                s = (rank + 1.0) ** -p.routing_skew
                w = w * (s / np.sqrt(np.mean(s * s)))[:, None]
            return w.astype(np.float32)
        self.items.append((name, (n_expert, n_embd), Q.F32, make))

    def _norm(self, name, n, scale: float = 1.0):
        self._f32(name, (n,), lambda r: scale * (1.0 + 0.1 * r.standard_normal(n)))

    def _f32(self, name, shape, sample):
        """An F32 tensor of sample(its generator)'s values."""
        self.items.append((name, shape, Q.F32, lambda: sample(self._rng(name)).astype(np.float32)))

    def _rng(self, name: str) -> np.random.Generator:
        return _rng(self.seed, name, self.version)


def _write_metadata(w: GGUFWriter, p: Preset, seed: int) -> None:
    w.add_name(f"epmci-synthetic-{p.name}-seed{seed}")
    w.add_uint32("epmci.generator_version", p.generator_version)
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
    w.add_rope_freq_base(p.rope_base)
    w.add_expert_count(p.n_expert)
    w.add_expert_used_count(p.n_expert_used)
    w.add_file_type(15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    if p.qwen35 is not None:
        q = p.qwen35
        w.add_expert_shared_feed_forward_length(q.n_ff_shexp)
        w.add_rope_dimension_count(q.rope_dim)
        w.add_rope_dimension_sections(list(q.rope_sections))
        w.add_full_attention_interval(q.full_attention_interval)
        w.add_ssm_conv_kernel(q.conv_kernel)
        w.add_ssm_state_size(q.state_size)
        w.add_ssm_group_count(q.group_count)
        w.add_ssm_time_step_rank(q.time_step_rank)
        w.add_ssm_inner_size(q.state_size * q.time_step_rank)
    write_vocab(w, build_vocab(p.n_vocab))


Progress = Callable[[str, int, int], None]   # (stage, done, total): "write" bytes, "calibrate" layers


def _remove_stale_temps(out: Path) -> None:
    """Temp files of `out` left by a make that was killed (a SIGKILL runs no cleanup); each
    temp name holds its writer's pid, so a live writer's file is never touched."""
    for f in out.parent.glob(f"{glob.escape(out.name)}.*.tmp"):
        pid = f.name[len(out.name) + 1:].split(".", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            f.unlink(missing_ok=True)
        except PermissionError:   # another user's live process
            pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_model(p: Preset, seed: int, out: str | os.PathLike, progress: Progress | None = None) -> Path:
    """Write the model to `out` atomically (temp file in the same folder, then rename),
    one tensor at a time. `progress(stage, done, total)` is called as it goes."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out)
    fd, tmp = tempfile.mkstemp(prefix=f"{out.name}.{os.getpid()}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())   # mkstemp's 0600 would make a private model
    report = progress or (lambda stage, done, total: None)
    try:
        plan = TensorPlan(p, seed)
        w = GGUFWriter(tmp, p.arch)
        _write_metadata(w, p, seed)
        sizes = []
        for name, shape, qtype, _ in plan.items:
            dtype = np.float32 if qtype == Q.F32 else np.uint8
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            sizes.append(nbytes)
            w.add_tensor_info(name, shape, np.dtype(dtype), nbytes,
                              raw_dtype=None if qtype == Q.F32 else qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        done, total = 0, sum(sizes)
        for (_, _, _, make), nbytes in zip(plan.items, sizes):
            w.write_tensor_data(make())
            done += nbytes
            report("write", done, total)
        w.close()
        if p.calibrate:
            from .calibrate import calibrate_router
            calibrate_router(tmp, calibration_tokens(p, seed),
                             lambda layer: report("calibrate", layer + 1, p.n_layer))
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
