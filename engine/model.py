"""The qwen3moe forward pass, in the order of the graph (see docs/engine-contract.md).

Dense weights are the model's resident copies (GGUFModel.load_resident); expert weights
come from an ExpertStore (resident: the mapped file; paged: the RAM arena), which is the
only thing that differs between `--no-pager` and a paged run -- so their logits must be
identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from . import kernels as K
from . import ops
from .gguf_model import GGUFModel, HParams
from .kernels import Activation
from .traces import MoETrace


class ExpertViews(Protocol):
    """fetch()'s answer: expert -> its (gate, up, down) byte views; indexing an expert whose
    read is still under way waits for it, and `ready` says whether it would."""

    def __getitem__(self, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def ready(self, e: int) -> bool: ...


class InPlace(dict):
    """ExpertViews of experts that need no read (the mapped file)."""

    def ready(self, e: int) -> bool:
        return True


class ExpertStore(Protocol):
    """Where expert bytes come from. `fetch` returns the experts' views, valid until
    `release`; `begin_layer` is the prefetch hook; `counters` are the exact paging counters
    so far (docs/engine-contract.md; empty when nothing is paged)."""

    def begin_layer(self, il: int, x: np.ndarray) -> None: ...
    def fetch(self, il: int, experts: list[int]) -> ExpertViews: ...
    def release(self, il: int) -> None: ...
    def end_batch(self, n_tokens: int) -> None: ...
    def counters(self) -> dict: ...
    def close(self) -> None: ...


def experts_ffn(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], types: tuple[int, int, int],
                a: Activation, rows_of: list[np.ndarray]) -> np.ndarray:
    """Experts on their rows of a: down(silu(gate x) * up x) for expert m = parts[m] on the
    rows rows_of[m]. Returns the output rows expert by expert (expert 0's rows, then 1's...).
    Each product as ggml computes it, all experts in one kernel call per product (gate and
    up in one when their types agree)."""
    t_gate, t_up, t_down = types
    gates, ups, downs = ([p[i] for p in parts] for i in range(3))
    n = sum(len(r) for r in rows_of)
    if t_gate == t_up:
        gate_up = K.matmul_rows(gates + ups, t_gate, a, rows_of + rows_of)
        gate, up = gate_up[:n], gate_up[n:]
    else:
        gate, up = K.matmul_rows(gates, t_gate, a, rows_of), K.matmul_rows(ups, t_up, a, rows_of)
    ends = np.cumsum([len(r) for r in rows_of])
    return K.matmul_rows(downs, t_down, Activation(ops.swiglu(gate, up)),
                         [np.arange(end - len(r), end) for r, end in zip(rows_of, ends)])


def kv_cache_shapes(hp, n_ctx: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the K cache (layer, kv head, dim, position: transposed for the dots with
    consecutive keys) and of the V cache (layer, position, kv head, dim). They hold
    float32 values rounded to f16, the values of llama.cpp's default F16 cache."""
    return ((hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx), (hp.n_layer, n_ctx, hp.n_head_kv, hp.head_dim))


def kv_cache_bytes(hp, n_ctx: int) -> int:
    """Bytes of the K and V caches, for the budget check before they exist."""
    return 4 * sum(int(np.prod(s)) for s in kv_cache_shapes(hp, n_ctx))


class Model:
    rms_norm = staticmethod(ops.rms_norm)   # squares in double (qwen35moe: float32 squares)

    def __init__(self, gm: GGUFModel, experts: ExpertStore, n_ctx: int):
        self.gm, self.hp, self.experts = gm, gm.hp, experts
        hp = self.hp
        self.n_ctx = n_ctx
        k_shape, v_shape = kv_cache_shapes(self.cached_layers(), n_ctx)
        self.k_cache = np.zeros(k_shape, dtype=np.float32)
        self.v_cache = np.zeros(v_shape, dtype=np.float32)
        self.n_past = 0
        self.on_moe: Callable[[MoETrace], None] | None = None
        self._w = {name: (t.data, int(t.qtype)) for name, t in gm.tensors.items() if "_exps." not in name}
        self._exp_types = [tuple(int(gm.expert_part(il, p).qtype) for p in ("gate", "up", "down"))
                           for il in range(hp.n_layer)]

    def cached_layers(self) -> HParams:
        """The hyperparameters the KV cache is shaped by: every layer keeps one here."""
        return self.hp

    def expert_types(self, il: int) -> tuple[int, int, int]:
        """ggml types of layer il's gate, up and down expert weights."""
        return self._exp_types[il]

    def _mm(self, name: str, x) -> np.ndarray:
        w, qtype = self._w[name]
        return K.matmul(w, qtype, x)

    def _vec(self, name: str) -> np.ndarray:
        return self._w[name][0]

    def logits(self, x: np.ndarray, rows: int | None) -> np.ndarray:
        """The output head for the last `rows` rows of the residual stream x (None: all).
        Rows are independent, so a row's logits have the same bits however many are asked;
        at a 248k-token vocabulary the head is most of a prefill's work and its rows the
        largest arrays a run keeps."""
        if rows is not None:
            x = x[len(x) - rows:]
        h = self.rms_norm(x, self._vec("output_norm.weight"), self.hp.rms_eps)
        return self._mm("output.weight" if "output.weight" in self._w else "token_embd.weight", h)

    def forward(self, tokens: np.ndarray, logits_rows: int | None = None) -> np.ndarray:
        """Evaluate a micro-batch of tokens at positions n_past..; returns the logits of its
        last `logits_rows` positions (None: all n), (rows, n_vocab)."""
        hp = self.hp
        tokens = np.asarray(tokens, dtype=np.int64)
        n, D, p0 = len(tokens), hp.head_dim, self.n_past
        if p0 + n > self.n_ctx:
            raise ValueError(f"context full: {p0 + n} tokens > n_ctx {self.n_ctx}")
        cos, sin = ops.rope_cache(np.arange(p0, p0 + n), D, hp.rope_base)
        scale = np.float32(1.0 / np.sqrt(D))
        emb, emb_type = self._w["token_embd.weight"]
        x = K.dequantize_rows(np.ascontiguousarray(emb[tokens]), emb_type)

        for il in range(hp.n_layer):
            b = f"blk.{il}."
            self.experts.begin_layer(il, x)

            # attention
            h = Activation(ops.rms_norm(x, self._vec(b + "attn_norm.weight"), hp.rms_eps))
            q = self._mm(b + "attn_q.weight", h).reshape(n, hp.n_head, D)
            k = self._mm(b + "attn_k.weight", h).reshape(n, hp.n_head_kv, D)
            v = self._mm(b + "attn_v.weight", h).reshape(n, hp.n_head_kv, D)
            q = ops.rms_norm_heads(q, self._vec(b + "attn_q_norm.weight"), hp.rms_eps)
            k = ops.rms_norm_heads(k, self._vec(b + "attn_k_norm.weight"), hp.rms_eps)
            q, k = ops.rope_neox(q, cos, sin), ops.rope_neox(k, cos, sin)
            self.k_cache[il, :, :, p0:p0 + n] = ops.round_f16(k).transpose(1, 2, 0)
            self.v_cache[il, p0:p0 + n] = ops.round_f16(v)
            p = ops.attention_probs(ops.round_f16(q), self.k_cache[il], p0, scale)
            attn = ops.attention_values(ops.round_f16(p), self.v_cache[il, :p0 + n])
            x = x + self._mm(b + "attn_output.weight", attn)

            # routed experts
            h = ops.rms_norm(x, self._vec(b + "ffn_norm.weight"), hp.rms_eps)
            x = x + self.moe(il, h)

        self.experts.end_batch(n)
        self.n_past += n
        return self.logits(x, logits_rows)

    def route(self, il: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Router softmax over all experts, top-k (ties: lower id), renormalized weights."""
        probs = ops.softmax(self._mm(f"blk.{il}.ffn_gate_inp.weight", h))
        selected = np.argsort(-probs, axis=-1, kind="stable")[:, :self.hp.n_expert_used].astype(np.int32)
        w = np.take_along_axis(probs, selected, axis=-1)
        return selected, (w / w.sum(axis=-1, keepdims=True, dtype=np.float32)).astype(np.float32)

    def moe(self, il: int, h: np.ndarray) -> np.ndarray:
        return self.moe_output(self.moe_request(il, h))

    def moe_request(self, il: int, h: np.ndarray) -> "RoutedRows":
        """Route h's rows and ask the store for their experts: the reads of the missing ones
        start now; moe_output waits for them."""
        selected, weights = self.route(il, h)
        experts = list(dict.fromkeys(selected.ravel().tolist()))  # first-use order
        return RoutedRows(il, h, selected, weights, experts, self.experts.fetch(il, experts))

    def moe_output(self, r: "RoutedRows") -> np.ndarray:
        """The routed experts' weighted sum for r's rows. The experts already in memory are
        computed first, the rest once their reads land: each output row is computed alone,
        so splitting the experts into two kernel calls changes no bit, and the first call
        overlaps the reads."""
        selected = r.selected
        # (row, slot) pairs grouped by expert in first-use order, row-major within one
        rank = np.empty(self.hp.n_expert, dtype=np.int64)
        rank[r.experts] = np.arange(len(r.experts))
        ranks = rank[selected.ravel()]
        order = np.argsort(ranks, kind="stable")
        rows_of = np.split(order // selected.shape[1], np.cumsum(np.bincount(ranks, minlength=len(r.experts)))[:-1])
        a, types = Activation(r.h), self.expert_types(r.il)
        ready = [r.views.ready(e) for e in r.experts]
        if all(ready) or not any(ready):
            ey = experts_ffn([r.views[e] for e in r.experts], types, a, rows_of)
        else:   # the experts in memory while the others are read, then those
            starts = np.cumsum([0] + [len(rows) for rows in rows_of])
            ey = np.empty((selected.size, self.hp.n_embd), np.float32)
            for group in ([m for m, now in enumerate(ready) if now], [m for m, now in enumerate(ready) if not now]):
                y = experts_ffn([r.views[r.experts[m]] for m in group], types, a, [rows_of[m] for m in group])
                ey[np.concatenate([np.arange(starts[m], starts[m + 1]) for m in group])] = y
        self.experts.release(r.il)
        at = np.empty(selected.size, dtype=np.int64)   # (row, slot) -> its row of ey
        at[order] = np.arange(selected.size)
        # weight each expert's output, then add them in selection order (as ggml does)
        out = ops.combine_experts(ey, at.reshape(selected.shape), r.weights)
        if self.on_moe is not None:
            self.on_moe(MoETrace(r.il, r.h, selected, r.weights, out))
        return out


@dataclass
class RoutedRows:
    """A micro-batch's rows at one layer's MoE: their experts chosen, the reads asked for."""
    il: int
    h: np.ndarray
    selected: np.ndarray     # (rows, n_expert_used) expert ids, in selection order
    weights: np.ndarray      # (rows, n_expert_used) their renormalized weights
    experts: list[int]       # the distinct experts, in first-use order
    views: ExpertViews


class ResidentExperts:
    """Experts read in place from the memory-mapped file (`--no-pager`). When the whole
    file's experts are in the page cache at start, they are mapped then: a fresh process's
    first prefill otherwise took every expert page fault (bench, -t 1: 1.32 s for 119
    tokens against 1.07 s mapped; mapping took 0.11 s)."""

    def __init__(self, gm: GGUFModel):
        self.parts = [[gm.layer(il, f"ffn_{p}_exps").data for p in ("gate", "up", "down")]
                      for il in range(gm.hp.n_layer)]
        # tensor by tensor: the dense tensors between them are read into anonymous memory and
        # dropped from the page cache (GGUFModel.load_resident), which a mapping would prevent
        tensors = [t for name, t in gm.tensors.items() if "_exps." in name]
        self.mapped = all([gm.file.map_cached(t.offset, t.offset + t.data.nbytes) for t in tensors])

    def begin_layer(self, il: int, x: np.ndarray) -> None:
        pass

    def fetch(self, il: int, experts: list[int]):
        g, u, d = self.parts[il]
        return InPlace((e, (g[e], u[e], d[e])) for e in experts)

    def release(self, il: int) -> None:
        pass

    def end_batch(self, n_tokens: int) -> None:
        pass

    def counters(self) -> dict:
        return {}

    def close(self) -> None:
        pass
