"""Open and validate a qwen3moe or qwen35moe GGUF: hyperparameters, tensor index, expert byte ranges.

Everything epmci knows about a model file comes through here. Both architectures have the
same routed experts (gate/up/down per layer, paged); qwen35moe adds Gated DeltaNet layers
beside the full-attention ones and a shared expert per layer, which is a dense tensor set
and not a paged expert (docs/qwen35moe.md). Tensor bytes are read
straight from the file by offset (never through the engine), so the reference stays an
independent second implementation.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from ..errors import InputError

ARCH = "qwen3moe"
QWEN35 = "qwen35moe"
ARCHS = (ARCH, QWEN35)
GGUF_MAGIC = b"GGUF"
EXPERT_PARTS = ("gate", "up", "down")


@dataclass(frozen=True)
class SsmParams:
    """qwen35moe's Gated DeltaNet (ssm.* keys)."""
    conv_kernel: int      # Kc
    state_size: int       # ds: head dim of q, k and v
    group_count: int      # G: q/k heads
    time_step_rank: int   # V: value heads
    inner_size: int       # d_inner = ds * V

    @property
    def key_dim(self) -> int:
        return self.state_size * self.group_count

    @property
    def value_dim(self) -> int:
        return self.state_size * self.time_step_rank

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv1d: q, k and v."""
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class HParams:
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_ff: int
    n_ff_exp: int
    n_expert: int
    n_expert_used: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    n_vocab: int
    arch: str = ARCH
    rope_dim: int = 0                      # R: rotated dims per head (qwen3moe: head_dim)
    rope_sections: tuple[int, ...] = ()    # qwen35moe multi-section RoPE
    n_ff_shexp: int = 0                    # shared expert FFN; 0 = no shared expert
    recurrent: tuple[bool, ...] = ()       # per layer: Gated DeltaNet (qwen35moe), else attention
    ssm: SsmParams | None = None

    def is_recurrent(self, layer: int) -> bool:
        return bool(self.recurrent) and self.recurrent[layer]

    def layer_kind(self, layer: int) -> str:
        return "deltanet" if self.is_recurrent(layer) else "attention"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order: fastest dimension first
    offset: int  # absolute file offset of the first byte
    n_bytes: int

    @property
    def row_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return self.shape[0] // block * size


@dataclass(frozen=True)
class ExpertRange:
    """One expert part (gate, up or down) of one layer: a contiguous byte range."""

    qtype: GGMLQuantizationType
    offset: int
    n_bytes: int
    rows: int
    cols: int


def _must_be_f32(name: str) -> bool:
    """qwen35moe tensors llama.cpp's CPU ops take as F32 only (docs/qwen35moe.md, Tensors)."""
    return name.endswith(("norm.weight", ".ssm_a", "ssm_dt.bias", "ssm_conv1d.weight"))


class ModelFile:
    """A validated qwen3moe or qwen35moe GGUF. Raises InputError (path + problem) on anything unusable."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._check_container()
        try:
            self.reader = GGUFReader(self.path)
        except Exception as e:  # gguf-py raises ValueError/IndexError/... on damage
            raise InputError(self.path, f"corrupt or truncated GGUF ({type(e).__name__}: {e})") from None
        self._check_strings()
        arch = self.meta("general.architecture", None)
        if arch not in ARCHS:
            raise InputError(self.path, f"architecture is {arch!r}, expected one of {', '.join(ARCHS)}")
        self.tensors = {t.name: TensorInfo(t.name, GGMLQuantizationType(t.tensor_type),
                                           tuple(int(d) for d in t.field.parts[3]),
                                           int(t.data_offset), int(t.n_bytes))
                        for t in self.reader.tensors}
        self._check_layout()
        try:
            self.hp = self._hparams(arch)
        except (TypeError, ValueError, OverflowError) as e:   # a count or scale that is no number
            raise InputError(self.path, f"bad hyperparameter metadata ({e})") from None
        self._check_hparams()
        self._check_shapes()
        self._check_vocab()

    def _check_container(self) -> None:
        if not self.path.exists():
            raise InputError(self.path, "no such file")
        if not self.path.is_file():
            raise InputError(self.path, "not a regular file")
        size = self.path.stat().st_size
        if size == 0:
            raise InputError(self.path, "empty file")
        with open(self.path, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise InputError(self.path, "not a GGUF file (bad magic)")
        if size < 24:
            raise InputError(self.path, "truncated GGUF header")

    def _check_strings(self) -> None:
        """Every metadata string is UTF-8 (GGUF's rule), so every later read can decode it."""
        for key, field in self.reader.fields.items():
            if field.types and field.types[-1] == GGUFValueType.STRING:
                for n, part in enumerate(field.data):
                    try:
                        field.parts[part].tobytes().decode("utf-8")
                    except UnicodeDecodeError as e:
                        item = f"[{n}]" if field.types[0] == GGUFValueType.ARRAY else ""
                        raise InputError(self.path, f"metadata {key}{item} is not valid UTF-8 "
                                                    f"({e.reason} at byte {e.start})") from None

    def _check_layout(self) -> None:
        """The tensor data layout llama.cpp's GGUF loader insists on: tensors in info order,
        each at the previous one's end rounded up to the alignment, none past the file's end."""
        size, align = self.path.stat().st_size, int(self.reader.alignment)
        expected = int(self.reader.data_offset)
        for t in self.tensors.values():
            if t.offset != expected:
                raise InputError(self.path, f"tensor {t.name} data starts at byte {t.offset}, expected "
                                            f"{expected} (in order, padded to {align} bytes)")
            if t.offset + t.n_bytes > size:
                raise InputError(self.path, f"truncated: tensor {t.name} ends at byte "
                                            f"{t.offset + t.n_bytes}, file has {size}")
            expected += (t.n_bytes + align - 1) // align * align

    def _check_hparams(self) -> None:
        hp = self.hp
        counts = ("n_layer", "n_ctx_train", "n_embd", "n_ff_exp", "n_expert", "n_expert_used",
                  "n_head", "n_head_kv", "head_dim")
        for name in counts:
            if getattr(hp, name) < 1:
                raise InputError(self.path, f"hyperparameter {name} is {getattr(hp, name)}, must be >= 1")
        for name in ("rms_eps", "rope_base"):
            if not (math.isfinite(getattr(hp, name)) and getattr(hp, name) > 0):
                raise InputError(self.path, f"hyperparameter {name} is {getattr(hp, name)}, must be > 0")

    def _check_vocab(self) -> None:
        """The vocabulary arrays as a byte-level BPE loader (llama.cpp's, the engine's) needs
        them: one token string per embedding row, no two alike (empty tokens are named apart,
        so those may repeat), an INT32 type per token if types are given, and the merges."""
        def array_of(key: str, item: GGUFValueType, required: bool = True):
            field = self.reader.get_field(key)
            if field is None and not required:
                return None
            if field is None or field.types[0] != GGUFValueType.ARRAY or field.types[1:] not in ([], [item]):
                raise InputError(self.path, f"metadata {key} must be an array of {item.name}")
            return field.contents()

        tokens = array_of("tokenizer.ggml.tokens", GGUFValueType.STRING)
        if len(tokens) != self.hp.n_vocab:
            raise InputError(self.path, f"vocabulary has {len(tokens)} tokens, token_embd.weight has "
                                        f"{self.hp.n_vocab} rows")
        first: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t and first.setdefault(t, i) != i:
                raise InputError(self.path, f"duplicate token in vocabulary: {t!r} has ids {first[t]} and {i}")
        types = array_of("tokenizer.ggml.token_type", GGUFValueType.INT32, required=False)
        if types is not None and len(types) < len(tokens):
            raise InputError(self.path, f"tokenizer.ggml.token_type has {len(types)} entries for "
                                        f"{len(tokens)} tokens")
        if not array_of("tokenizer.ggml.merges", GGUFValueType.STRING):
            raise InputError(self.path, "metadata tokenizer.ggml.merges is empty")

    def meta(self, key: str, default: object = KeyError) -> object:
        field = self.reader.get_field(key)
        if field is None:
            if default is KeyError:
                raise InputError(self.path, f"missing metadata key {key}")
            return default
        value = field.contents()
        return value

    def _hparams(self, arch: str) -> HParams:
        p = arch + "."
        n_embd = int(self.meta(p + "embedding_length"))
        n_head = int(self.meta(p + "attention.head_count"))
        emb = self.tensor("token_embd.weight")
        hp = HParams(
            n_layer=int(self.meta(p + "block_count")),
            n_ctx_train=int(self.meta(p + "context_length")),
            n_embd=n_embd,
            n_ff=int(self.meta(p + "feed_forward_length", 0)),
            n_ff_exp=int(self.meta(p + "expert_feed_forward_length")),
            n_expert=int(self.meta(p + "expert_count")),
            n_expert_used=int(self.meta(p + "expert_used_count")),
            n_head=n_head,
            n_head_kv=int(self.meta(p + "attention.head_count_kv", n_head)),
            head_dim=int(self.meta(p + "attention.key_length", n_embd // n_head)),
            rms_eps=float(self.meta(p + "attention.layer_norm_rms_epsilon")),
            rope_base=float(self.meta(p + "rope.freq_base", 10000.0)),
            n_vocab=emb.shape[1],
            arch=arch,
        )
        self._check_counts(hp)
        hp = dataclasses.replace(hp, rope_dim=hp.head_dim)
        return self._qwen35_hparams(hp) if arch == QWEN35 else hp

    def _check_counts(self, hp: HParams) -> None:
        if hp.n_expert <= 0 or not 0 < hp.n_expert_used <= hp.n_expert:
            raise InputError(self.path, f"bad expert counts: {hp.n_expert_used} of {hp.n_expert}")
        if hp.n_head % hp.n_head_kv:
            raise InputError(self.path, f"head_count {hp.n_head} not a multiple of head_count_kv {hp.n_head_kv}")

    def _qwen35_hparams(self, base: HParams) -> HParams:
        """qwen35moe: the qwen3moe keys plus the ssm.* keys, rope sections, shared expert and
        layer kinds, read as llama.cpp's llama_model_qwen35moe::load_arch_hparams does."""
        p = QWEN35 + "."
        ssm = SsmParams(*(int(self.meta(p + "ssm." + k)) for k in
                           ("conv_kernel", "state_size", "group_count", "time_step_rank", "inner_size")))
        if ssm.inner_size != ssm.value_dim:
            raise InputError(self.path, f"{p}ssm.inner_size is {ssm.inner_size}, expected ssm.state_size "
                                        f"{ssm.state_size} x ssm.time_step_rank {ssm.time_step_rank} = {ssm.value_dim}")
        if ssm.group_count <= 0 or ssm.time_step_rank % ssm.group_count:
            raise InputError(self.path, f"{p}ssm.time_step_rank {ssm.time_step_rank} is not a multiple of "
                                        f"ssm.group_count {ssm.group_count}")
        if ssm.conv_kernel < 1:
            raise InputError(self.path, f"{p}ssm.conv_kernel is {ssm.conv_kernel}, expected >= 1")
        sections = tuple(int(v) for v in np.atleast_1d(self.meta(p + "rope.dimension_sections")))
        if len(sections) == 1:
            sections *= 4                       # get_key_or_arr replicates a scalar
        D, R = base.head_dim, int(self.meta(p + "rope.dimension_count", base.head_dim))
        if len(sections) != 4 or sum(sections) > D or not any(sections[:3]) or min(sections) < 0:
            raise InputError(self.path, f"{p}rope.dimension_sections is {list(sections)}, expected 4 "
                                        f"counts >= 0 summing to <= head dim {D}, one of the first three > 0")
        if R % 2 or not 0 < R <= D:
            raise InputError(self.path, f"{p}rope.dimension_count is {R}, expected even and <= head dim {D}")
        if int(self.meta(p + "attention.value_length", D)) != D:
            raise InputError(self.path, f"{p}attention.value_length differs from key_length {D}")
        n_mtp = int(self.meta(p + "nextn_predict_layers", 0))
        n_layer = base.n_layer - n_mtp          # the MTP blocks come last and are not run
        if not 0 < n_layer <= base.n_layer:
            raise InputError(self.path, f"{p}nextn_predict_layers {n_mtp} leaves no layers of {base.n_layer}")
        recurrent = self.meta(p + "attention.recurrent_layers", None)
        if recurrent is not None:
            recurrent = [bool(v) for v in np.atleast_1d(recurrent)]
            if len(recurrent) != base.n_layer:
                raise InputError(self.path, f"{p}attention.recurrent_layers has {len(recurrent)} entries, "
                                            f"expected block_count {base.n_layer}")
        else:
            interval = int(self.meta(p + "full_attention_interval", 4))
            if interval <= 0:
                raise InputError(self.path, f"{p}full_attention_interval is {interval}, expected > 0")
            recurrent = [(i + 1) % interval != 0 for i in range(base.n_layer)]
        return dataclasses.replace(
            base, n_layer=n_layer, rope_dim=R, rope_sections=sections, ssm=ssm,
            n_ff_shexp=int(self.meta(p + "expert_shared_feed_forward_length", base.n_ff)),
            recurrent=tuple(recurrent[:n_layer]))

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise InputError(self.path, f"missing tensor {name}") from None

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        E, D, X = hp.n_embd, hp.head_dim, hp.n_expert
        shapes = {"token_embd.weight": (E, hp.n_vocab), "output_norm.weight": (E,)}
        if "output.weight" in self.tensors:
            shapes["output.weight"] = (E, hp.n_vocab)
        # qwen35moe's attention projects a query and a gate per head (attn_q is 2x wide)
        q_rows = (2 if hp.arch == QWEN35 else 1) * hp.n_head * D
        for i in range(hp.n_layer):
            b = f"blk.{i}."
            shapes[b + "attn_norm.weight"] = (E,)
            if hp.is_recurrent(i):
                ssm = hp.ssm
                shapes.update({
                    b + "attn_qkv.weight": (E, ssm.conv_dim),
                    b + "attn_gate.weight": (E, ssm.value_dim),
                    b + "ssm_conv1d.weight": (ssm.conv_kernel, ssm.conv_dim),
                    b + "ssm_dt.bias": (ssm.time_step_rank,),
                    b + "ssm_a": (ssm.time_step_rank,),
                    b + "ssm_beta.weight": (E, ssm.time_step_rank),
                    b + "ssm_alpha.weight": (E, ssm.time_step_rank),
                    b + "ssm_norm.weight": (ssm.state_size,),
                    b + "ssm_out.weight": (ssm.value_dim, E),
                })
            else:
                shapes.update({
                    b + "attn_q.weight": (E, q_rows),
                    b + "attn_k.weight": (E, hp.n_head_kv * D),
                    b + "attn_v.weight": (E, hp.n_head_kv * D),
                    b + "attn_output.weight": (hp.n_head * D, E),
                    b + "attn_q_norm.weight": (D,),
                    b + "attn_k_norm.weight": (D,),
                })
            shapes.update({
                # qwen35moe's pre-FFN norm is HF's post_attention_layernorm
                b + ("post_attention_norm.weight" if hp.arch == QWEN35 else "ffn_norm.weight"): (E,),
                b + "ffn_gate_inp.weight": (E, X),
                b + "ffn_gate_exps.weight": (E, hp.n_ff_exp, X),
                b + "ffn_up_exps.weight": (E, hp.n_ff_exp, X),
                b + "ffn_down_exps.weight": (hp.n_ff_exp, E, X),
            })
            if hp.arch == QWEN35:
                shapes.update({
                    b + "ffn_gate_inp_shexp.weight": (E,),
                    b + "ffn_gate_shexp.weight": (E, hp.n_ff_shexp),
                    b + "ffn_up_shexp.weight": (E, hp.n_ff_shexp),
                    b + "ffn_down_shexp.weight": (hp.n_ff_shexp, E),
                })
        return shapes

    def _check_shapes(self) -> None:
        for name, shape in self.expected_shapes().items():
            got = self.tensor(name).shape
            if got != shape:
                raise InputError(self.path, f"tensor {name} has shape {list(got)}, expected {list(shape)}")
            if self.hp.arch == QWEN35 and _must_be_f32(name) and self.tensors[name].qtype != GGMLQuantizationType.F32:
                raise InputError(self.path, f"tensor {name} is {self.tensors[name].qtype.name}, "
                                            f"expected F32 (llama.cpp's qwen35moe graph aborts on anything else)")

    # ------------------------------------------------------------------ bytes

    @cached_property
    def _map(self) -> np.memmap:
        return np.memmap(self.path, dtype=np.uint8, mode="r")

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as uint8 of shape (rows..., row_bytes), numpy order."""
        t = self.tensor(name)
        rows = t.shape[1:][::-1]
        return self._map[t.offset:t.offset + t.n_bytes].reshape(*rows, t.row_bytes)

    def expert_range(self, layer: int, expert: int, part: str) -> ExpertRange:
        t = self.tensor(f"blk.{layer}.ffn_{part}_exps.weight")
        per_expert = t.n_bytes // t.shape[2]
        return ExpertRange(t.qtype, t.offset + expert * per_expert, per_expert,
                           rows=t.shape[1], cols=t.shape[0])

    def expert_bytes(self, layer: int) -> int:
        """Bytes of one expert (gate + up + down) in this layer."""
        return sum(self.expert_range(layer, 0, p).n_bytes for p in EXPERT_PARTS)

    def read_expert(self, layer: int, expert: int, part: str) -> np.ndarray:
        """One expert part as (rows, row_bytes) uint8, read from the file by offset."""
        r = self.expert_range(layer, expert, part)
        with open(self.path, "rb") as f:
            data = os.pread(f.fileno(), r.n_bytes, r.offset)
        if len(data) != r.n_bytes:
            raise InputError(self.path, f"short read of blk.{layer} expert {expert} {part}")
        return np.frombuffer(data, dtype=np.uint8).reshape(r.rows, r.n_bytes // r.rows)
