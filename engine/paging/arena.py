"""The expert arena: one page-aligned allocation cut into slots of two size classes.

Every layer's experts have one byte size (gate + up + down); a model has one or two sizes
(the production model: 1,900,544 B on most layers, 2,039,808 B where `down` is Q6_K).
The arena gets a slot class per size, `small` and `large`, with slot counts in proportion
to how many experts of each size the model has, so no byte of the arena is wasted on
padding a small expert into a large slot. `uniform=True` (SDQ_FORCE_UNIFORM_SLOT=1) sizes
every slot for the largest expert: one class.

Within a slot, gate, up and down sit one after another, each in its own 4096-byte-aligned
window. With `direct` (SDQ_DIRECT_IO=1, the default) a part whose per-expert size is a
multiple of 4096 is read as the 4096-aligned range of the file that covers it: GGUF tensor
data is only 32-byte aligned, so the part's bytes start `head` = offset % 4096 bytes into
that range, the same for every expert of the tensor, and the read (offset, length and
destination all aligned) can bypass the page cache with O_DIRECT. It moves up to one page
more than the part. Other parts, and every part without `direct`, are read exactly.
An expert only ever goes into a slot of its own class; `class_of_layer` says which.

The minimum arena holds one layer's routed experts for one micro-batch:
`need = min(n_expert, batch * n_expert_used)` slots of every class some layer uses (with
mixed slots a small layer cannot borrow large slots, nor the other way round).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np

from ..gguf_model import EXPERT_PARTS, GGUFModel, ModelError

ALIGN = 4096
MiB = 1 << 20


def round_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class PartLayout:
    offset_in_slot: int   # where the part's bytes start in a slot (= window start + head)
    file_offset: int      # absolute offset of expert 0's bytes of this part
    stride: int           # bytes per expert (= length of one expert's part)
    rows: int
    row_bytes: int
    head: int             # bytes read before the part (aligned window); 0: exact read
    window: int           # bytes one read of this part moves (head + stride + tail)


@dataclass(frozen=True)
class LayerLayout:
    """Where one layer's expert parts live in the file and in a slot."""
    parts: tuple[PartLayout, PartLayout, PartLayout]   # gate, up, down
    expert_bytes: int     # sum of the three strides: the expert's bytes (ssd_bytes counts these)
    slot_bytes: int       # sum of the three windows rounded up to 4096: what a slot must hold
    read_bytes: int       # sum of the three windows: what one read of the expert moves

    def ranges(self, expert: int) -> list[tuple[int, int, int]]:
        """(file offset, length, offset in slot) of the reads of the gate, up and down parts."""
        return [(p.file_offset + expert * p.stride - p.head, p.window, p.offset_in_slot - p.head)
                for p in self.parts]


def part_window(offset: int, stride: int, n_expert: int, file_size: int, direct: bool) -> tuple[int, int]:
    """(head, window) of one expert part: the aligned range covering it when every expert's
    range is aligned the same way and the last one ends inside the file, else the exact bytes."""
    head = offset % ALIGN
    window = round_up(head + stride)
    last_end = offset - head + (n_expert - 1) * stride + window
    if direct and head and stride % ALIGN == 0 and last_end <= file_size:
        return head, window
    return 0, stride


def layer_layouts(gm: GGUFModel, direct: bool = True) -> list[LayerLayout]:
    out = []
    file_size = gm.path.stat().st_size
    for il in range(gm.hp.n_layer):
        parts, pos = [], 0
        for name in EXPERT_PARTS:
            ep = gm.expert_part(il, name)
            head, window = part_window(ep.offset, ep.stride, gm.hp.n_expert, file_size, direct)
            parts.append(PartLayout(pos + head, ep.offset, ep.stride, ep.rows, ep.row_bytes, head, window))
            pos += round_up(window)
        out.append(LayerLayout(tuple(parts), sum(p.stride for p in parts), pos,
                               sum(p.window for p in parts)))
    return out


@dataclass(frozen=True)
class SlotPlan:
    """How many slots of which size; computed before anything is allocated."""
    class_sizes: tuple[int, ...]       # slot bytes per class; (large,) or (small, large)
    class_names: tuple[str, ...]       # ("large",) or ("small", "large")
    n_slots: tuple[int, ...]           # per class
    class_of_layer: tuple[int, ...]    # class index of each layer's experts
    need: tuple[int, ...]              # minimum slots per class (one layer, one micro-batch)
    min_bytes: int
    uniform: bool

    @property
    def total_bytes(self) -> int:
        return sum(s * n for s, n in zip(self.class_sizes, self.n_slots))

    @property
    def total_slots(self) -> int:
        return sum(self.n_slots)

    def n_class(self, name: str) -> int:
        return self.n_slots[self.class_names.index(name)] if name in self.class_names else 0

    def describe_min(self, batch: int) -> str:
        parts = [f"{n} {name} slots of {s} B" for name, s, n in
                 zip(self.class_names, self.class_sizes, self.need) if n]
        return (f"minimum {self.min_bytes / MiB:.2f} MiB = {' + '.join(parts)}: one layer's "
                f"routed experts for a micro-batch of {batch}")


def plan_slots(layouts: list[LayerLayout], n_expert: int, n_expert_used: int, batch: int,
               arena_bytes: int, uniform: bool) -> SlotPlan:
    """Cut `arena_bytes` into slots. Raises ModelError below the minimum."""
    sizes = sorted({l.slot_bytes for l in layouts})
    need1 = min(n_expert, max(1, batch) * n_expert_used)
    if uniform or len(sizes) == 1:
        class_sizes, names = (sizes[-1],), ("large",)
        class_of_layer = tuple(0 for _ in layouts)
    else:
        # Two classes: the largest size, and everything smaller (sized for the second largest).
        class_sizes, names = (sizes[-2], sizes[-1]), ("small", "large")
        class_of_layer = tuple(1 if l.slot_bytes == sizes[-1] else 0 for l in layouts)
    n_cls = len(class_sizes)
    experts_per_class = [n_expert * sum(1 for c in class_of_layer if c == k) for k in range(n_cls)]
    need = tuple(need1 if experts_per_class[k] else 0 for k in range(n_cls))
    min_bytes = sum(n * s for n, s in zip(need, class_sizes))
    plan_min = SlotPlan(class_sizes, names, need, class_of_layer, need, min_bytes, n_cls == 1)
    if arena_bytes < min_bytes:
        raise ModelError(f"arena {arena_bytes / MiB:.2f} MiB is below the {plan_min.describe_min(batch)}"
                         f" (use --arena-mb {(min_bytes + MiB - 1) // MiB} or more)")
    if n_cls == 1:
        n = [min(arena_bytes // class_sizes[0], experts_per_class[0])]
    else:
        # Proportional split: per "model unit" of one expert of every size as counted in the model.
        S, L = class_sizes
        cs, cl = experts_per_class
        n_large = int(arena_bytes * cl // (cs * S + cl * L))
        n_large = max(n_large, need[1])
        n_large = min(n_large, (arena_bytes - need[0] * S) // L)
        n_small = (arena_bytes - n_large * L) // S
        # Never more slots than experts of the class; give bytes the other class can use.
        if n_small > cs:
            n_small = cs
            n_large = min(cl, (arena_bytes - n_small * S) // L)
        if n_large > cl:
            n_large = cl
            n_small = min(cs, (arena_bytes - n_large * L) // S)
        n = [n_small, n_large]
    assert all(a >= b for a, b in zip(n, need)), (n, need)
    return SlotPlan(class_sizes, names, tuple(n), class_of_layer, need, min_bytes, n_cls == 1)


class Arena:
    """One anonymous mmap (page-aligned, untouched pages cost no RSS) holding every slot."""

    def __init__(self, plan: SlotPlan):
        self.plan = plan
        self.size = plan.total_bytes
        self.mem = mmap.mmap(-1, max(self.size, ALIGN), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.buf = np.frombuffer(self.mem, dtype=np.uint8, count=self.size)
        self.slot_offset: list[int] = []
        self.slot_size: list[int] = []
        self.slot_class: list[int] = []
        pos = 0
        for k, (size, n) in enumerate(zip(plan.class_sizes, plan.n_slots)):
            for _ in range(n):
                self.slot_offset.append(pos)
                self.slot_size.append(size)
                self.slot_class.append(k)
                pos += size
        self.n_slots = len(self.slot_offset)
        self._views: dict[tuple[int, int], tuple] = {}

    def slot_memoryview(self, slot: int, offset_in_slot: int, length: int) -> memoryview:
        o = self.slot_offset[slot] + offset_in_slot
        return memoryview(self.mem)[o:o + length]

    def expert_views(self, slot: int, layout: LayerLayout, layout_id: int) -> tuple:
        """(gate, up, down) uint8 (rows, row_bytes) views of a slot for a layer's layout."""
        key = (slot, layout_id)
        v = self._views.get(key)
        if v is None:
            base = self.slot_offset[slot]
            v = tuple(self.buf[base + p.offset_in_slot: base + p.offset_in_slot + p.stride]
                      .reshape(p.rows, p.row_bytes) for p in layout.parts)
            # Compute only reads slots (I/O writes through the mapping, not these views);
            # read-only views also share the resident path's compiled kernels.
            for a in v:
                a.flags.writeable = False
            self._views[key] = v
        return v

    def contains(self, a: np.ndarray) -> bool:
        return np.shares_memory(a, self.buf)

    def close(self) -> None:
        self._views.clear()
        self.buf = None
        try:
            self.mem.close()
        except BufferError:
            pass  # views still alive somewhere; the mapping goes with them
