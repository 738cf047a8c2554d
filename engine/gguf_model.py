"""Load a qwen3moe or qwen35moe GGUF for the engine: hyperparameters and vocabulary from
metadata, tensors as views.

A file the engine cannot use is a ModelError naming the file and the problem (the CLI's one
line, exit 2), raised before anything large is read: the header's parse errors
(engine/gguf_file.py), metadata strings that are not UTF-8, tensor data not laid out as llama.cpp's loader requires, hyperparameters
that are no positive number, shapes, and the tokenizer's refusals (duplicate tokens, ...).

Every tensor starts as a view into one read-only memory map of the file. `load_resident`
then reads the non-expert tensors (attention, norms, router, embeddings, output) into
anonymous memory: mapped file pages can be reclaimed under memory pressure and silently
read again, which would be disk I/O no counter sees; anonymous pages stay (there is no
swap on the machines this targets; `vm_swap_mb` would show it). Expert tensors stay
mapped: the pager (engine/paging/) decides how their bytes reach RAM.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from .gguf_file import GGUFFile, GGUFFormatError, GGUFStringError, TensorInfo
from .qtypes import QTYPES
from .tokenizer import Tokenizer

ARCH = "qwen3moe"
QWEN35 = "qwen35moe"   # Gated DeltaNet + gated attention layers, a shared expert (engine/qwen35moe.py)
ARCHS = (ARCH, QWEN35)
SUPPORTED = {Q(t) for t in QTYPES}
EXPERT_PARTS = ("gate", "up", "down")


def type_name(ggml_type: int) -> str:
    try:
        return Q(ggml_type).name
    except ValueError:
        return f"number {ggml_type}"


def tensor_bytes(t: TensorInfo) -> int:
    block, bsize = GGML_QUANT_SIZES[Q(t.ggml_type)]
    return math.prod(t.shape) // block * bsize


class ModelError(Exception):
    """The model file cannot be used. The CLI prints `path: problem` and exits 2."""


@dataclass(frozen=True)
class SsmParams:
    """qwen35moe's Gated DeltaNet (the ssm.* keys; ssm.inner_size = state_size * time_step_rank)."""
    conv_kernel: int      # Kc: taps of the causal conv1d
    state_size: int       # ds: head dim of the delta net's q, k and v
    group_count: int      # G: q/k heads
    time_step_rank: int   # V: value heads

    @property
    def key_dim(self) -> int:
        return self.state_size * self.group_count

    @property
    def value_dim(self) -> int:
        return self.state_size * self.time_step_rank

    @property
    def conv_dim(self) -> int:
        """Channels of the conv: q, k and v."""
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class HParams:
    n_layer: int
    n_ctx_train: int
    n_embd: int
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
    rope_dim: int = 0                      # rotated dims per head (qwen3moe: head_dim)
    rope_sections: tuple[int, ...] = ()    # qwen35moe's multi-section RoPE
    n_ff_shexp: int = 0                    # shared expert FFN (qwen35moe); 0: none
    recurrent: tuple[bool, ...] = ()       # per layer: Gated DeltaNet (qwen35moe), else attention
    ssm: SsmParams | None = None

    def is_recurrent(self, il: int) -> bool:
        return bool(self.recurrent) and self.recurrent[il]


@dataclass(frozen=True)
class Tensor:
    name: str
    qtype: Q
    shape: tuple[int, ...]   # ggml order, fastest dimension first
    offset: int              # absolute file offset
    data: np.ndarray         # (rows..., row_bytes) uint8, or float32 for F32


@dataclass(frozen=True)
class ExpertPart:
    qtype: Q
    offset: int    # absolute file offset of expert 0's bytes
    stride: int    # bytes per expert
    rows: int
    row_bytes: int


def _huge_page_memory(nbytes: int) -> np.ndarray:
    """uint8[nbytes] in a private anonymous mapping advised onto transparent huge pages. A
    decoded token streams the dense weights through the products, and with 4 KiB pages the
    prefetcher stops and the TLB misses at every page: on 2 MiB pages one-thread products
    from memory ran 13-18 % faster (docs/PERF.md, "Huge pages"). Where THP is "madvise" only
    regions that ask get them; where it is off or no huge page is free, pages are 4 KiB.
    Private: shared anonymous memory is shmem, whose huge pages follow another switch. (The
    pager's arena stays on 4 KiB pages: its slots are first touched during decode, where
    2 MiB faults measured no faster and up to 20 % slower.)"""
    mem = mmap.mmap(-1, max(nbytes, mmap.PAGESIZE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mem.madvise(mmap.MADV_HUGEPAGE)
        except OSError:   # THP compiled out of this kernel
            pass
    return np.frombuffer(mem, dtype=np.uint8, count=nbytes)


class GGUFModel:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"{self.path}: no such file")
        size = self.path.stat().st_size
        if size < 24:
            raise ModelError(f"{self.path}: {'empty file' if size == 0 else 'truncated GGUF header'}")
        with open(self.path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelError(f"{self.path}: not a GGUF file (bad magic)")
        try:
            self.file = GGUFFile(self.path)
        except GGUFStringError as e:
            raise ModelError(f"{self.path}: {e}") from None
        except (GGUFFormatError, OverflowError, ValueError) as e:
            raise ModelError(f"{self.path}: corrupt or truncated GGUF ({type(e).__name__}: {e})") from None
        arch = self._meta("general.architecture", None)
        if arch not in ARCHS:
            raise ModelError(f"{self.path}: unsupported architecture {arch!r} (engine runs {', '.join(ARCHS)})")
        for t in self.file.tensors:   # before the layout: the clearer word for a retyped tensor
            if t.ggml_type not in SUPPORTED:
                raise ModelError(f"{self.path}: tensor {t.name} has unsupported type {type_name(t.ggml_type)}")
        self._check_layout(size)
        self.tensors: dict[str, Tensor] = {}
        for t in self.file.tensors:
            qtype = Q(t.ggml_type)
            start = self.file.data_offset + t.offset
            raw = self.file.data[start:start + tensor_bytes(t)]
            rows = t.shape[1:][::-1]
            if qtype == Q.F32:
                data = raw.view(np.float32).reshape(*rows, t.shape[0])
            else:
                block, bsize = GGML_QUANT_SIZES[qtype]
                data = raw.reshape(*rows, t.shape[0] // block * bsize)
            self.tensors[t.name] = Tensor(t.name, qtype, t.shape, start, data)
        self.hp = self._hparams(arch)
        self._check_shapes()
        self.tokenizer = self._tokenizer()

    def _check_layout(self, size: int) -> None:
        """Tensor data as llama.cpp's GGUF loader requires it: whole blocks per row, in
        tensor-info order, each tensor where the previous one ends padded to the alignment,
        all inside the file."""
        align, start, want = self.file.alignment, self.file.data_offset, 0
        for t in self.file.tensors:
            block = GGML_QUANT_SIZES[Q(t.ggml_type)][0]
            if not t.shape or t.shape[0] % block:
                raise ModelError(f"{self.path}: tensor {t.name} has shape {list(t.shape)}: rows of whole "
                                 f"{block}-value blocks expected")
            if t.offset != want:
                raise ModelError(f"{self.path}: tensor {t.name} has data offset {t.offset}, expected {want} "
                                 f"(tensors in order, each padded to {align} bytes)")
            n = tensor_bytes(t)
            if start + t.offset + n > size:
                raise ModelError(f"{self.path}: truncated (tensor {t.name} runs past end of file)")
            want += -(-n // align) * align

    def _meta(self, key: str, default=KeyError):
        field = self.file.fields.get(key)
        if field is None:
            if default is KeyError:
                raise ModelError(f"{self.path}: missing metadata key {key}")
            return default
        return field.contents()

    def _meta_positive(self, key: str, kind: type, default=KeyError):
        """The value as kind (int: a count, truncated as int() does; float: a scale), > 0."""
        v = self._meta(key, default)
        try:
            x = kind(v)
        except (TypeError, ValueError, OverflowError):
            x = 0
        if not (math.isfinite(x) and x > 0):
            raise ModelError(f"{self.path}: metadata {key} must be a positive {kind.__name__}, got {v!r}")
        return x

    def _hparams(self, arch: str) -> HParams:
        p = arch + "."
        n_embd = self._meta_positive(p + "embedding_length", int)
        n_head = self._meta_positive(p + "attention.head_count", int)
        hp = HParams(
            n_layer=self._meta_positive(p + "block_count", int),
            n_ctx_train=self._meta_positive(p + "context_length", int),
            n_embd=n_embd,
            n_ff_exp=self._meta_positive(p + "expert_feed_forward_length", int),
            n_expert=self._meta_positive(p + "expert_count", int),
            n_expert_used=self._meta_positive(p + "expert_used_count", int),
            n_head=n_head,
            n_head_kv=self._meta_positive(p + "attention.head_count_kv", int, n_head),
            head_dim=self._meta_positive(p + "attention.key_length", int, n_embd // n_head),
            rms_eps=self._meta_positive(p + "attention.layer_norm_rms_epsilon", float),
            rope_base=self._meta_positive(p + "rope.freq_base", float, 10000.0),
            n_vocab=self.tensor("token_embd.weight").shape[1],
            arch=arch,
        )
        if not 0 < hp.n_expert_used <= hp.n_expert:
            raise ModelError(f"{self.path}: bad expert counts ({hp.n_expert_used} of {hp.n_expert})")
        if hp.n_head % hp.n_head_kv:
            raise ModelError(f"{self.path}: head_count not a multiple of head_count_kv")
        hp = replace(hp, rope_dim=hp.head_dim)
        return self._qwen35_hparams(hp) if arch == QWEN35 else hp

    def _qwen35_hparams(self, hp: HParams) -> HParams:
        """The ssm.* keys, partial multi-section RoPE, the shared expert's FFN and the layer
        kinds, as llama.cpp's llama_model_qwen35moe::load_arch_hparams reads them."""
        p = QWEN35 + "."
        ssm = SsmParams(*(self._meta_positive(p + "ssm." + k, int)
                          for k in ("conv_kernel", "state_size", "group_count", "time_step_rank")))
        inner = self._meta_positive(p + "ssm.inner_size", int)
        if inner != ssm.value_dim:
            raise ModelError(f"{self.path}: {p}ssm.inner_size {inner} is not ssm.state_size x "
                             f"ssm.time_step_rank = {ssm.value_dim}")
        if ssm.time_step_rank % ssm.group_count:
            raise ModelError(f"{self.path}: {p}ssm.time_step_rank not a multiple of ssm.group_count")
        D = hp.head_dim
        rope_dim = self._meta_positive(p + "rope.dimension_count", int, D)
        sections = tuple(int(v) for v in np.atleast_1d(self._meta(p + "rope.dimension_sections")))
        sections = sections * 4 if len(sections) == 1 else sections   # a scalar is replicated
        if rope_dim % 2 or rope_dim > D or len(sections) != 4 or min(sections) < 0 or sum(sections) > D:
            raise ModelError(f"{self.path}: rope.dimension_count {rope_dim} / rope.dimension_sections "
                             f"{list(sections)} do not fit head dim {D}")
        n_mtp = self._meta(p + "nextn_predict_layers", 0)   # MTP blocks come last and are not run
        if not isinstance(n_mtp, int) or not 0 <= n_mtp < hp.n_layer:
            raise ModelError(f"{self.path}: {p}nextn_predict_layers {n_mtp!r} leaves no layer of {hp.n_layer}")
        recurrent = self._meta(p + "attention.recurrent_layers", None)
        if recurrent is None:
            interval = self._meta_positive(p + "full_attention_interval", int, 4)
            recurrent = [(i + 1) % interval != 0 for i in range(hp.n_layer)]
        recurrent = np.atleast_1d(recurrent)
        if len(recurrent) != hp.n_layer:
            raise ModelError(f"{self.path}: {p}attention.recurrent_layers has {len(recurrent)} entries, "
                             f"expected {hp.n_layer}")
        return replace(hp, n_layer=hp.n_layer - n_mtp, rope_dim=rope_dim, rope_sections=sections, ssm=ssm,
                       n_ff_shexp=self._meta_positive(p + "expert_shared_feed_forward_length", int),
                       recurrent=tuple(bool(v) for v in recurrent[:hp.n_layer - n_mtp]))

    def tensor(self, name: str) -> Tensor:
        if name not in self.tensors:
            raise ModelError(f"{self.path}: missing tensor {name}")
        return self.tensors[name]

    def _check_shapes(self) -> None:
        hp = self.hp
        E, D, X, F = hp.n_embd, hp.head_dim, hp.n_expert, hp.n_ff_exp
        q35 = hp.arch == QWEN35
        want = {"token_embd.weight": (E, hp.n_vocab), "output_norm.weight": (E,)}
        if "output.weight" in self.tensors:
            want["output.weight"] = (E, hp.n_vocab)
        for i in range(hp.n_layer):
            b = f"blk.{i}."
            want[b + "attn_norm.weight"] = (E,)
            if hp.is_recurrent(i):
                s = hp.ssm
                want.update({
                    b + "attn_qkv.weight": (E, s.conv_dim), b + "attn_gate.weight": (E, s.value_dim),
                    b + "ssm_conv1d.weight": (s.conv_kernel, s.conv_dim), b + "ssm_dt.bias": (s.time_step_rank,),
                    b + "ssm_a": (s.time_step_rank,), b + "ssm_beta.weight": (E, s.time_step_rank),
                    b + "ssm_alpha.weight": (E, s.time_step_rank), b + "ssm_norm.weight": (s.state_size,),
                    b + "ssm_out.weight": (s.value_dim, E),
                })
            else:   # qwen35moe's attn_q holds a query and a gate per head
                want.update({
                    b + "attn_q.weight": (E, (2 if q35 else 1) * hp.n_head * D),
                    b + "attn_k.weight": (E, hp.n_head_kv * D), b + "attn_v.weight": (E, hp.n_head_kv * D),
                    b + "attn_output.weight": (hp.n_head * D, E), b + "attn_q_norm.weight": (D,),
                    b + "attn_k_norm.weight": (D,),
                })
            want.update({
                self.ffn_norm_name(i): (E,),
                b + "ffn_gate_inp.weight": (E, X), b + "ffn_gate_exps.weight": (E, F, X),
                b + "ffn_up_exps.weight": (E, F, X), b + "ffn_down_exps.weight": (F, E, X),
            })
            if q35:
                Fs = hp.n_ff_shexp
                want.update({
                    b + "ffn_gate_inp_shexp.weight": (E,), b + "ffn_gate_shexp.weight": (E, Fs),
                    b + "ffn_up_shexp.weight": (E, Fs), b + "ffn_down_shexp.weight": (Fs, E),
                })
        for name, shape in want.items():
            got = self.tensor(name).shape
            if got != shape:
                raise ModelError(f"{self.path}: tensor {name} has shape {list(got)}, expected {list(shape)}")
        # the router in F32 (as llama.cpp keeps it); qwen35moe's norms, conv and decay
        # parameters too (llama.cpp's graph aborts on anything else)
        f32 = ("ffn_gate_inp.weight",) + (("norm.weight", ".ssm_a", "ssm_dt.bias", "ssm_conv1d.weight",
                                           "ffn_gate_inp_shexp.weight") if q35 else ())
        for name in want:
            if name.endswith(f32) and self.tensor(name).qtype != Q.F32:
                raise ModelError(f"{self.path}: {name} must be F32")

    def ffn_norm_name(self, il: int) -> str:
        """The MoE's input norm (qwen35moe calls it post_attention_norm: HF's
        post_attention_layernorm, applied to the residual stream after the mixer)."""
        return f"blk.{il}." + ("post_attention_norm.weight" if self.hp.arch == QWEN35 else "ffn_norm.weight")

    def _tokenizer(self) -> Tokenizer:
        try:
            tok = Tokenizer.from_gguf(self.file.fields)
        except ValueError as e:   # the vocabulary cannot be used (duplicates, types, ...)
            raise ModelError(f"{self.path}: {e}") from None
        if tok.n_vocab != self.hp.n_vocab:
            raise ModelError(f"{self.path}: vocabulary has {tok.n_vocab} tokens, "
                             f"token_embd.weight has {self.hp.n_vocab} rows")
        return tok

    def layer(self, il: int, name: str) -> Tensor:
        return self.tensor(f"blk.{il}.{name}.weight")

    def expert_part(self, il: int, part: str) -> ExpertPart:
        t = self.layer(il, f"ffn_{part}_exps")
        n_expert, rows, row_bytes = t.data.shape
        return ExpertPart(t.qtype, t.offset, rows * row_bytes, rows, row_bytes)

    def expert_bytes(self, il: int) -> int:
        return sum(self.expert_part(il, p).stride for p in EXPERT_PARTS)

    def load_resident(self) -> None:
        """Replace every non-expert tensor's view with a read-only copy in anonymous memory
        (one mapping on huge pages where the system has them, each tensor at a cache line:
        _huge_page_memory), read with pread (not through the map, so no file page is
        counted twice in RSS) and then dropped from the page cache."""
        dense = [(name, t) for name, t in self.tensors.items() if "_exps." not in name]
        starts = np.cumsum([0] + [-(-t.data.nbytes // 64) * 64 for _, t in dense])
        memory = _huge_page_memory(int(starts[-1]))
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for (name, t), start in zip(dense, starts):
                buf = memory[start:start + t.data.nbytes]
                done = 0
                while done < buf.nbytes:
                    n = os.preadv(fd, [memoryview(buf)[done:]], t.offset + done)
                    if n <= 0:
                        raise ModelError(f"{self.path}: short read of tensor {name}")
                    done += n
                data = buf.view(t.data.dtype).reshape(t.data.shape)
                data.flags.writeable = False   # same kernel specializations as the mapped views
                self.tensors[name] = replace(t, data=data)
                os.posix_fadvise(fd, t.offset, t.data.nbytes, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def resident_bytes(self) -> int:
        """Bytes of every tensor that is not an expert tensor (kept in RAM by the engine)."""
        return sum(t.data.nbytes for n, t in self.tensors.items() if "_exps." not in n)
