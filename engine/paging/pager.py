"""The expert pager: the ExpertStore of a paged run (see engine/model.py and
docs/engine-contract.md).

Ties together the arena (arena.py), the cache policy (cache_policy.py), the reader pool
(expert_io.py) and layer-ahead prefetch (prefetch.py), configured by config.py and
checked against the RAM budget (budget.py):

    begin_layer(L, x)  predict layer L+ahead's experts, issue prefetch reads
    fetch(L, experts)  look the experts up; issue reads for misses; return lazy views
                       (indexing one waits for its read: compute overlaps the others)
    release(L)         the views are done with; their slots become evictable again
    end_batch(n)       advance the token clock; expire stale predictions

Every decision is made here, on the calling (main) thread, when a read is issued; the
reader threads only move bytes. Before a slot is written, any read still in flight into
it is waited for; before a slot is computed from, its read is waited for (io_wait_s).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Mapping

import numpy as np

from ..gguf_model import GGUFModel, ModelError
from ..machine import memory_limit
from ..traces import PredictionTrace
from . import budget
from .arena import ALIGN, Arena, MiB, layer_layouts, plan_slots
from .cache_policy import CachePolicy, Decision, Key
from .config import DEFAULT_ARENA_FRACTION, PagerConfig, read_profile
from .expert_io import ExpertIO, ReadHandle
from .prefetch import Predictor, PrefetchQueue


def slot_error(msg: str) -> RuntimeError:
    print(f"[epm] SLOT-ERROR {msg}", file=sys.stderr, flush=True)
    return RuntimeError(f"SLOT-ERROR {msg}")


class _Views(Mapping):
    """fetch()'s result (engine.model.ExpertViews): expert -> (gate, up, down); indexing waits
    for that expert's read, `ready` says whether it has landed."""

    def __init__(self, pager: "Pager", layer: int, decisions: list[Decision]):
        self._p, self._layer = pager, layer
        self._d = {d.key[1]: d for d in decisions}

    def __getitem__(self, e):
        return self._p._views_of(self._layer, self._d[e])

    def ready(self, e) -> bool:
        return self._p._read_done(self._d[e])

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


class Pager:
    """ExpertStore over a fixed arena. See the module docstring."""

    def __init__(self, gm: GGUFModel, cfg: PagerConfig | None = None, batch: int = 32, n_ctx: int = 512,
                 kv_bytes: int = 0, keep_logits: bool = True):
        """Plans the arena and checks the RAM budget (kv_bytes: the forward's caches;
        keep_logits: the run keeps every position's logits) before anything large is
        allocated or read."""
        self.gm, self.cfg = gm, cfg or PagerConfig()
        hp = gm.hp
        self.batch, self.n_ctx = max(1, batch), n_ctx
        self.layouts = layer_layouts(gm, self.cfg.direct_io)
        shapes: dict = {}
        self.shape_id = [shapes.setdefault(tuple((p.offset_in_slot, p.stride, p.rows, p.row_bytes)
                                                 for p in l.parts), len(shapes)) for l in self.layouts]
        self.expert_bytes_total = hp.n_expert * sum(l.expert_bytes for l in self.layouts)

        def plan_for(arena_bytes: int):
            return plan_slots(self.layouts, hp.n_expert, hp.n_expert_used, self.batch, arena_bytes,
                              self.cfg.force_uniform_slot)
        probe = plan_for(1 << 62)
        transient = self._transient_bytes(probe)
        parts = budget.breakdown(gm, 0, kv_bytes, self.batch, n_ctx, transient, keep_logits)
        # no --ram-budget-mb: the budget is the memory this process has (engine/machine.py)
        if self.cfg.ram_budget_mb is not None:
            budget_mb, self.budget_source, named = self.cfg.ram_budget_mb, "--ram-budget-mb", None
        else:
            limit, self.budget_source = memory_limit()
            budget_mb = limit / MiB
            named = f"the engine's memory, {budget_mb:,.0f} MiB ({self.budget_source}; --ram-budget-mb sets another)"
        self.budget_mb = budget_mb
        if self.cfg.arena_mb is not None:
            arena_bytes = int(self.cfg.arena_mb * MiB)
        else:   # the default leaves the budget's other parts room
            arena_bytes = min(int(self.expert_bytes_total * DEFAULT_ARENA_FRACTION),
                              int(budget_mb * MiB) - sum(parts.values()))
            arena_bytes = max(arena_bytes, probe.min_bytes)
        plan = plan_for(arena_bytes)
        parts["arena"] = plan.total_bytes
        self.ram_need_bytes = sum(parts.values())   # reported as ram_need_mb, budget or not
        budget.check(budget_mb, parts, named)
        self.plan = plan
        self.arena_bytes_requested = arena_bytes
        self.policy = CachePolicy(plan.n_slots, plan.class_of_layer, self.cfg.admit_min_hits, plan.need)
        self.pins: list[tuple[Key, int]] = []
        if self.cfg.hot_pin > 0:
            if not self.cfg.profile_in:
                raise ModelError("SDQ_HOT_PIN: needs SDQ_PROFILE_IN (a --profile-out file)")
            prof = read_profile(self.cfg.profile_in, hp.n_layer, hp.n_expert)
            want = [k for k, _ in prof[:self.cfg.hot_pin]]
            self.pins = self.policy.pin(want)
            if len(self.pins) < len(want):
                print(f"[epm] hot-pin: pinned {len(self.pins)} of {len(want)} experts (each slot class "
                      f"keeps {'/'.join(map(str, plan.need))} slots for one layer's micro-batch)",
                      file=sys.stderr)
        self.arena = Arena(plan)
        self._arena_addr = self.arena.buf.ctypes.data if self.arena.size else 0
        self.io = ExpertIO(gm.path, self.cfg.io_threads, self.cfg.io_parallel, self.cfg.fadv_dontneed,
                           self.cfg.direct_io)
        self.predictor = Predictor(gm) if self.cfg.prefetch else None
        self.queue = PrefetchQueue(self.cfg.prefetch_queue, self.cfg.prefetch_stale_tokens)
        self.slot_read: list[ReadHandle | None] = [None] * self.arena.n_slots
        self._transient: dict[Key, tuple[np.ndarray, ReadHandle]] = {}
        self.clock = 0
        self.current_layer = -1
        self.ssd_bytes = 0      # expert bytes read (pins excluded)
        self.io_bytes = 0       # bytes those reads moved, aligned windows included
        self.pin_bytes = 0
        self.io_wait_s = 0.0
        # branch events of layer-ahead prefetch: predictions made, and the layers ahead of
        # the current one they were made for (summed), and outstanding prefetches gone stale
        self.predictions = self.layers_ahead = self.prefetch_stale = 0
        self.profile: Counter[Key] = Counter()
        self.trace: list[tuple[int, list[int]]] | None = None   # set to [] to record lookups
        self.on_prediction: Callable[[PredictionTrace], None] | None = None   # SDQ_PREFETCH_DUMP
        self.read_log: list[tuple[str, Key]] | None = None      # set to [] to record reads
        self._started = False
        self._closed = False

    # ------------------------------------------------------------ budget / start

    def _transient_bytes(self, plan) -> int:
        """Admission-deferred misses of one layer's micro-batch sit in transient buffers."""
        if self.cfg.admit_min_hits <= 1:
            return 0
        return max(plan.need) * (max(plan.class_sizes) + ALIGN)

    def start(self) -> None:
        """Load the pins (the engine calls it at startup; a fetch before it does too)."""
        if self._started:
            return
        self._started = True
        for key, slot in self.pins:
            self._read_into_slot(key, slot)
            self.pin_bytes += self.layouts[key[0]].expert_bytes
            if self.read_log is not None:
                self.read_log.append(("pin", key))
        self.io.flush()

    # ------------------------------------------------------------ reads

    def _wait(self, h: ReadHandle) -> None:
        self.io.flush()   # never wait on a read that is not handed to the readers yet
        self.io_wait_s += h.wait()

    def _ranges(self, key: Key, base_addr: int, mem: memoryview) -> list:
        layer, e = key
        return [(off, n, mem[pos:pos + n], base_addr + pos) for off, n, pos in self.layouts[layer].ranges(e)]

    def _count_read(self, layer: int) -> None:
        self.ssd_bytes += self.layouts[layer].expert_bytes
        self.io_bytes += self.layouts[layer].read_bytes

    def _read_into_slot(self, key: Key, slot: int) -> None:
        layout = self.layouts[key[0]]
        size = self.arena.slot_size[slot]
        if self.arena.slot_class[slot] != self.plan.class_of_layer[key[0]] or layout.slot_bytes > size:
            names = self.plan.class_names
            raise slot_error(f"layer {key[0]} expert {key[1]} ({names[self.plan.class_of_layer[key[0]]]}, "
                             f"{layout.slot_bytes} B) assigned to slot {slot} "
                             f"({names[self.arena.slot_class[slot]]}, {size} B)")
        h = self.slot_read[slot]
        if h is not None:            # a read still in flight into this slot must land first
            self._wait(h)
        off = self.arena.slot_offset[slot]
        mem = self.arena.slot_memoryview(slot, 0, size)
        self.slot_read[slot] = self.io.submit(self._ranges(key, self._arena_addr + off, mem), defer=True,
                                              due=(self.clock, key[0]))

    def _read_transient(self, key: Key) -> None:
        layout = self.layouts[key[0]]
        raw = np.empty(layout.slot_bytes + ALIGN, dtype=np.uint8)
        pad = (-raw.ctypes.data) % ALIGN
        buf = raw[pad:pad + layout.slot_bytes]
        h = self.io.submit(self._ranges(key, buf.ctypes.data, memoryview(buf)), defer=True, due=(self.clock, key[0]))
        self._transient[key] = (buf, h)

    def _read_done(self, d: Decision) -> bool:
        h = self._transient[d.key][1] if d.slot < 0 else self.slot_read[d.slot]
        return h is None or h.done

    def _views_of(self, layer: int, d: Decision):
        layout = self.layouts[layer]
        if d.slot < 0:
            buf, h = self._transient[d.key]
            self._wait(h)
            views = tuple(buf[p.offset_in_slot:p.offset_in_slot + p.stride].reshape(p.rows, p.row_bytes)
                          for p in layout.parts)
            for a in views:
                a.flags.writeable = False  # same kernel specializations as slots and the mapped file
            return views
        slot = d.slot
        if self.policy.owner[slot] != d.key:
            raise slot_error(f"slot {slot} holds {self.policy.owner[slot]}, computed as {d.key}")
        h = self.slot_read[slot]
        if h is not None:
            self._wait(h)
            self.slot_read[slot] = None
        return self.arena.expert_views(slot, layout, self.shape_id[layer])

    # ------------------------------------------------------------ ExpertStore

    def begin_layer(self, il: int, x: np.ndarray) -> None:
        if not self._started:
            self.start()
        self.current_layer = il
        if self.predictor is None:
            return
        target = il + self.cfg.prefetch_layer_ahead
        protect: set[Key] = set()
        if target < self.gm.hp.n_layer:
            sel = self.predictor.predict(target, x)
            if self.on_prediction is not None:
                self.on_prediction(PredictionTrace(il, target, x, sel))
            keys = [(target, e) for e in dict.fromkeys(sel.ravel().tolist())]
            self.predictions += 1
            self.layers_ahead += target - il
            new = []
            for key in keys:
                if self.policy.resident(key):
                    self.policy.touch(key)   # predicted: keep it away from the eviction end
                    protect.add(key)
                else:
                    new.append(key)
            protect.update(new)
            self.queue.add(new, self.clock)

        def issue(key: Key, born: int) -> None:
            d = self.policy.prefetch(key, il, born, protect)
            if d is not None:
                self._read_into_slot(key, d.slot)
                self._count_read(key[0])
                if self.read_log is not None:
                    self.read_log.append(("prefetch", key))

        self.queue.pump(lambda: len(self.policy.outstanding), issue)
        self.io.flush()

    def fetch(self, il: int, experts: list[int]):
        if not self._started:
            self.start()
        self.queue.drop_layer(il)
        decisions = self.policy.lookup(il, experts)
        for d in decisions:
            self.profile[d.key] += 1
            if d.hit:
                continue
            self._count_read(il)
            if self.read_log is not None:
                self.read_log.append(("miss", d.key))
            if d.slot >= 0:
                self._read_into_slot(d.key, d.slot)
            else:
                self._read_transient(d.key)
        self.io.flush()
        if self.trace is not None:
            self.trace.append((il, [int(e) for e in experts]))
        return _Views(self, il, decisions)

    def release(self, il: int) -> None:
        self.policy.release()
        for buf, h in self._transient.values():
            self._wait(h)
        self._transient.clear()

    def end_batch(self, n_tokens: int) -> None:
        self.clock += int(n_tokens)
        self.queue.expire(self.clock)
        self.prefetch_stale += len(self.policy.drop_stale(self.clock, self.cfg.prefetch_stale_tokens))
        self.current_layer = -1

    # ------------------------------------------------------------ selftest

    def load_slot(self, il: int, e: int) -> tuple[int, tuple]:
        """Read expert e of layer il into an arena slot (admitting it whatever
        SDQ_ADMIT_MIN_HITS says) and return (slot, (gate, up, down) views from the slot).
        Call release(il) when done."""
        if not self._started:
            self.start()
        key = (il, e)
        self.policy.force_admit(key)
        d = self.policy.lookup(il, [e])[0]
        if d.slot < 0:
            raise slot_error(f"layer {il} expert {e}: not admitted to a slot")
        if not d.hit:
            self._count_read(il)
            self._read_into_slot(key, d.slot)
            if self.read_log is not None:
                self.read_log.append(("miss", key))
        views = self._views_of(il, d)
        if not all(self.arena.contains(v) for v in views):
            raise slot_error(f"layer {il} expert {e}: views are not in the arena")
        return d.slot, views

    # ------------------------------------------------------------ reporting

    def counters(self) -> dict:
        c = self.policy.counters()
        c["ssd_bytes"] = self.ssd_bytes
        c["io_bytes"] = self.io_bytes
        c["io_wait_s"] = self.io_wait_s
        c["io_direct_pct"] = self.io.direct_pct()
        c.update(prefetch_predictions=self.predictions, prefetch_layers_ahead=self.layers_ahead,
                 prefetch_queued=self.queue.queued, prefetch_late=self.queue.late,
                 prefetch_dropped=self.queue.dropped, prefetch_stale=self.prefetch_stale,
                 serial_reads=self.io.serial_reads, fadvise_ranges=self.io.fadvise_ranges)
        c["n_slots"] = self.plan.total_slots
        c["n_slots_small"] = self.plan.n_class("small")
        c["n_slots_large"] = self.plan.n_class("large")
        c["arena_mb"] = round(self.plan.total_bytes / MiB, 3)
        c["ram_need_mb"] = round(self.ram_need_bytes / MiB, 1)
        return c

    def profile_text(self) -> str:
        rows = sorted(self.profile.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1]))
        return "".join(f"{l} {e} {n}\n" for (l, e), n in rows)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for h in self.slot_read:
            if h is not None:
                try:
                    h.wait()
                except BaseException:
                    pass
        self.io.close()
        self.arena.close()

