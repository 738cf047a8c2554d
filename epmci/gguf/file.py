"""Open and validate a qwen3moe GGUF: hyperparameters, tensor index, expert byte ranges.

Everything epmci knows about a model file comes through here. Tensor bytes are read
straight from the file by offset (never through the engine), so the reference stays an
independent second implementation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from ..errors import InputError

ARCH = "qwen3moe"
GGUF_MAGIC = b"GGUF"
EXPERT_PARTS = ("gate", "up", "down")


@dataclass(frozen=True)
class Hparams:
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


class ModelFile:
    """A validated qwen3moe GGUF. Raises InputError (path + problem) on anything unusable."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._check_container()
        try:
            self.reader = GGUFReader(self.path)
        except Exception as e:  # gguf-py raises ValueError/IndexError/... on damage
            raise InputError(self.path, f"corrupt or truncated GGUF ({type(e).__name__}: {e})") from None
        arch = self.meta("general.architecture", None)
        if arch != ARCH:
            raise InputError(self.path, f"architecture is {arch!r}, expected {ARCH!r}")
        self.tensors = {t.name: TensorInfo(t.name, GGMLQuantizationType(t.tensor_type),
                                           tuple(int(d) for d in t.field.parts[3]),
                                           int(t.data_offset), int(t.n_bytes))
                        for t in self.reader.tensors}
        size = self.path.stat().st_size
        for t in self.tensors.values():
            if t.offset + t.n_bytes > size:
                raise InputError(self.path, f"truncated: tensor {t.name} ends at byte "
                                            f"{t.offset + t.n_bytes}, file has {size}")
        self.hp = self._hparams()
        self._check_shapes()

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

    def meta(self, key: str, default: object = KeyError) -> object:
        field = self.reader.get_field(key)
        if field is None:
            if default is KeyError:
                raise InputError(self.path, f"missing metadata key {key}")
            return default
        value = field.contents()
        return value

    def _hparams(self) -> Hparams:
        p = ARCH + "."
        n_embd = int(self.meta(p + "embedding_length"))
        n_head = int(self.meta(p + "attention.head_count"))
        emb = self.tensor("token_embd.weight")
        hp = Hparams(
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
        )
        if hp.n_expert <= 0 or not 0 < hp.n_expert_used <= hp.n_expert:
            raise InputError(self.path, f"bad expert counts: {hp.n_expert_used} of {hp.n_expert}")
        if hp.n_head % hp.n_head_kv:
            raise InputError(self.path, f"head_count {hp.n_head} not a multiple of head_count_kv {hp.n_head_kv}")
        return hp

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
        for i in range(hp.n_layer):
            b = f"blk.{i}."
            shapes.update({
                b + "attn_norm.weight": (E,),
                b + "attn_q.weight": (E, hp.n_head * D),
                b + "attn_k.weight": (E, hp.n_head_kv * D),
                b + "attn_v.weight": (E, hp.n_head_kv * D),
                b + "attn_output.weight": (hp.n_head * D, E),
                b + "attn_q_norm.weight": (D,),
                b + "attn_k_norm.weight": (D,),
                b + "ffn_norm.weight": (E,),
                b + "ffn_gate_inp.weight": (E, X),
                b + "ffn_gate_exps.weight": (E, hp.n_ff_exp, X),
                b + "ffn_up_exps.weight": (E, hp.n_ff_exp, X),
                b + "ffn_down_exps.weight": (hp.n_ff_exp, E, X),
            })
        return shapes

    def _check_shapes(self) -> None:
        for name, shape in self.expected_shapes().items():
            got = self.tensor(name).shape
            if got != shape:
                raise InputError(self.path, f"tensor {name} has shape {list(got)}, expected {list(shape)}")

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
