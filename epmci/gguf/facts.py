"""Expert layout facts of a model file as docs/engine-contract.md defines them (slot sizes,
slot classes, the minimum arena), derived from the file, never from the engine."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..units import round_up
from .file import EXPERT_PARTS, ModelFile


def slot_part_bytes(offset: int, n_bytes: int, n_expert: int, file_size: int, align: int,
                    windows: bool) -> int:
    """Slot bytes of one expert part: with aligned windows, a part whose size is a multiple of
    `align` takes the aligned file range that covers it (when the last expert's range ends
    inside the file); else its own bytes, rounded up to `align`."""
    head = offset % align
    window = round_up(head + n_bytes, align)
    if windows and head and n_bytes % align == 0 and offset - head + (n_expert - 1) * n_bytes + window <= file_size:
        return window
    return round_up(n_bytes, align)


@dataclass
class ModelFacts:
    n_layer: int
    n_expert: int
    n_expert_used: int
    n_embd: int
    types: list[tuple[str, str, str]]   # per layer: gate, up, down quant type names
    expert_bytes: list[int]             # per layer: gate + up + down bytes
    slot_bytes: list[int]               # per layer: the slot bytes of its three parts
    kinds: list[str] = field(default_factory=list)   # per layer: attention or deltanet (qwen35moe)
    file_bytes: int = 0                 # the GGUF's size
    n_vocab: int = 0
    n_ctx_train: int = 0                # the context length the model was trained for

    @classmethod
    def of(cls, mf: ModelFile, align: int, windows: bool = True) -> "ModelFacts":
        hp = mf.hp
        file_size = os.path.getsize(mf.path)
        types, eb, sb = [], [], []
        for il in range(hp.n_layer):
            parts = [mf.expert_range(il, 0, p) for p in EXPERT_PARTS]
            types.append(tuple(p.qtype.name for p in parts))
            eb.append(sum(p.n_bytes for p in parts))
            sb.append(sum(slot_part_bytes(p.offset, p.n_bytes, hp.n_expert, file_size, align, windows)
                          for p in parts))
        return cls(hp.n_layer, hp.n_expert, hp.n_expert_used, hp.n_embd, types, eb, sb,
                   [hp.layer_kind(il) for il in range(hp.n_layer)], file_size, hp.n_vocab, hp.n_ctx_train)

    def describe_layer(self, il: int) -> str:
        """Its experts' types and size; and its kind where the model has two."""
        kind = f"{self.kinds[il]} layer, " if len(set(self.kinds)) > 1 else ""
        return f"{kind}{'/'.join(self.types[il])}, {self.expert_bytes[il]} B"

    def slot_classes(self, uniform: bool) -> list[int]:
        """Slot sizes of the arena: one class (the largest) when uniform or when the model has
        one size; else the largest and the second largest (mixed)."""
        sizes = sorted(set(self.slot_bytes))
        return [sizes[-1]] if uniform or len(sizes) == 1 else sizes[-2:]

    def class_of_layers(self, uniform: bool) -> list[int]:
        """Each layer's slot class: 0 small, 1 large (the only class when uniform or one size)."""
        big = max(self.slot_bytes)
        return [1 if uniform or len(set(self.slot_bytes)) == 1 or b == big else 0 for b in self.slot_bytes]

    def min_arena_bytes(self, batch: int, uniform: bool, margin_slots: int = 0) -> int:
        """One layer's routed experts for one micro-batch, min(n_expert, batch*top_k) slots,
        in every slot class (a small layer cannot borrow a large slot, nor the reverse)."""
        need = min(self.n_expert, batch * self.n_expert_used) + margin_slots
        return sum(need * s for s in self.slot_classes(uniform))

    def slot_counts(self, arena_bytes: int, batch: int, uniform: bool) -> dict[str, int] | None:
        """The slots per class an arena of `arena_bytes` holds (docs/engine-contract.md, Paging:
        Arena and slots), {"small": n, "large": n}; None below the minimum. Mixed: the large
        class gets A * cl / (cs * S + cl * L) slots (cs, cl: experts of each class in the
        model; S, L: slot sizes), at least its need and leaving the small class its need; the
        small class the rest; neither more than its experts, bytes a capped class cannot use
        going to the other. The engine's own plan (engine/paging/arena.plan_slots) implements
        the same rule apart -- the engine does not import epmci -- and tests/test_promises.py
        holds the two equal on 200 arena sizes per layout."""
        sizes = self.slot_classes(uniform)
        if arena_bytes < self.min_arena_bytes(batch, uniform):
            return None
        need = min(self.n_expert, batch * self.n_expert_used)
        if len(sizes) == 1:
            return {"small": 0, "large": min(arena_bytes // sizes[0], self.n_expert * self.n_layer)}
        S, L = sizes
        cs, cl = self._class_experts(L)
        large = min(max(arena_bytes * cl // (cs * S + cl * L), need), (arena_bytes - need * S) // L)
        small = (arena_bytes - large * L) // S
        if small > cs:
            small = cs
            large = min(cl, (arena_bytes - small * S) // L)
        if large > cl:
            large = cl
            small = min(cs, (arena_bytes - large * L) // S)
        return {"small": small, "large": large}

    def _class_experts(self, large_slot: int) -> tuple[int, int]:
        """Experts of the small and of the large slot class in the whole model."""
        cl = self.n_expert * sum(1 for b in self.slot_bytes if b == large_slot)
        return self.n_expert * self.n_layer - cl, cl

    def margin_arena_bytes(self, batch: int, uniform: bool, margin_slots: int) -> int:
        """The smallest arena whose slots (slot_counts) leave every class margin_slots above
        its need (or all its experts): min_arena_bytes(margin) has the bytes, but the
        contract's split can give the whole margin to the large class, and a small class
        held at its need never reaches the slot plan's proportional branch."""
        lo = self.min_arena_bytes(batch, uniform, margin_slots)
        sizes = self.slot_classes(uniform)
        if len(sizes) == 1:
            return lo
        experts = dict(zip(("small", "large"), self._class_experts(sizes[1])))
        need = min(self.n_expert, batch * self.n_expert_used) + margin_slots
        hi = experts["small"] * sizes[0] + experts["large"] * sizes[1]

        def holds(arena: int) -> bool:
            got = self.slot_counts(arena, batch, uniform)
            return got is not None and all(got[k] >= min(n, need) for k, n in experts.items())

        if holds(lo) or lo >= hi:
            return lo
        while hi - lo > 1:           # slot_counts grows with the arena: the first size that holds
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(mid) else (mid, hi)
        return hi

    def total_expert_bytes(self) -> int:
        return sum(self.expert_bytes) * self.n_expert
