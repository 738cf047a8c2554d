"""Helpers of the fault-injection tests: a broken copy of the bundled engine is a small script
written into tmp_path that imports the engine, monkeypatches one thing and runs
engine.cli.main() -- driven with --engine-cmd, exactly as an external engine would be.
Nothing in the engine's production code knows about faults."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from dataclasses import dataclass

from epmci.cli import main as epmci_main

HEADER = "import sys, time\nimport numpy as np\nimport engine.cli\n"
FOOTER = "\nsys.exit(engine.cli.main())\n"
# a copy that no longer declares reference_exact: the gate compares it within a tolerance, as
# an engine that is not bit-identical to the reference
NOT_REFERENCE_EXACT = """
import engine.contract_info as _CI
_CI.FEATURES = tuple(f for f in _CI.FEATURES if f != "reference_exact")
"""


# Q6_K products 0.2 % too large, on every kernel path
Q6K_TOO_LARGE = """
import engine.kernels as K
import engine.kernels_x86 as A

def broken(good):
    return lambda ptrs, n_rows, row_bytes, qtype, *rest: (
        good(ptrs, n_rows, row_bytes, qtype, *rest) * np.float32(1.002 if qtype == K.Q6_K else 1.0))
K.matmul_kquant, A.matmul_kquant, A.matmul_kquant_512 = (broken(K.matmul_kquant), broken(A.matmul_kquant),
                                                         broken(A.matmul_kquant_512))
"""


def broken_engine(tmp_path, patch: str, name: str = "broken_engine.py", reference_exact: bool = True) -> str:
    script = tmp_path / name
    script.write_text(HEADER + ("" if reference_exact else NOT_REFERENCE_EXACT) + textwrap.dedent(patch) + FOOTER)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def run_check(tmp_path, model, engine_cmd: str | None, *args: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    argv = ["check", "--model", str(model), "--json", str(out), "--jobs", "2", "-q",
            "--workdir", str(tmp_path / "work")]
    if engine_cmd:
        argv += ["--engine-cmd", engine_cmd]
    rc = epmci_main(argv + list(args))
    report = json.loads(out.read_text()) if out.exists() else {}
    return rc, report


def results(report: dict, suite: str) -> list[dict]:
    for s in report["suites"]:
        if s["name"] == suite:
            return s["results"]
    return []


def statuses(report: dict, suite: str) -> dict[str, str]:
    return {r["name"]: r["status"] for r in results(report, suite)}

# layer 2's router logits nudged (a bias rising over the experts): routing moves there first,
# the logits only a little
ROUTER_NUDGED_IN_LAYER_2 = """
import engine.model as M
good = M.Model.route
def route(self, il, h):
    if il != 2:
        return good(self, il, h)
    probs = M.ops.softmax(self._mm(f"blk.{il}.ffn_gate_inp.weight", h) * np.float32(1.0) +
                          np.linspace(0, 0.5, self.hp.n_expert, dtype=np.float32))
    sel = np.argsort(-probs, axis=-1, kind="stable")[:, :self.hp.n_expert_used].astype(np.int32)
    w = np.take_along_axis(probs, sel, axis=-1)
    return sel, (w / w.sum(axis=-1, keepdims=True, dtype=np.float32)).astype(np.float32)
M.Model.route = route
"""


# ------------------------------------------------------------------ the fault set
# Every fault below is one realistic engine defect, written once: the tests that show which
# check catches it take it from here, and bench/fault_shapes.py runs the whole set across
# generated models (docs/fault-shapes.md).

@dataclass(frozen=True)
class Fault:
    patch: str
    kind: str              # the class of defect
    needs: str = ""        # what a model must have for the fault to change anything, as far as known
    arch: str = ""         # the only architecture whose code path it patches ("": every one)


def slot_fault(when: str, counts: str) -> str:
    """A copy of the engine whose slot plan takes `counts` (an expression of the right plan
    `p`) instead when `when` holds."""
    return f"""
import os
import engine.paging.arena as A, engine.paging.pager as P
good = A.plan_slots
def plan_slots(layouts, n_expert, n_expert_used, batch, arena_bytes, uniform):
    p = good(layouts, n_expert, n_expert_used, batch, arena_bytes, uniform)
    if {when}:
        p = A.SlotPlan(p.class_sizes, p.class_names, {counts}, p.class_of_layer, p.need, p.min_bytes, p.uniform)
    return p
A.plan_slots = P.plan_slots = plan_slots
"""


# A prefetch of a large-slot expert takes a free/evictable SMALL slot (the slot class is not
# checked), and the read is not bounds-checked either: it writes past the small slot into its
# neighbour -- the bug the original project's prefetch-stress layer was added for.
WRONG_SIZE_PREFETCH = """
import engine.paging.cache_policy as C, engine.paging.pager as P
def prefetch(self, key, current_layer, clock, protect=frozenset()):
    if key in self.where or not self.admissible(key):
        return None
    k = self.cls(key)
    k_slot = 0 if k == 1 and len(self.n_slots) == 2 else k
    taken = self._take(k_slot, lambda v: v[0] != current_layer and v not in self.in_use
                       and v not in self.outstanding and v not in protect)
    if taken is None:
        return None
    slot, victim = taken
    self.where[key] = slot
    self.owner[slot] = key
    self.lru[k_slot][key] = slot
    self.outstanding[key] = clock
    self.prefetch_issued += 1
    return C.Decision(key, False, slot, victim)
C.CachePolicy.prefetch = prefetch

def read_into_slot(self, key, slot):
    layout = self.layouts[key[0]]
    h = self.slot_read[slot]
    if h is not None:
        self._wait(h)
    off = self.arena.slot_offset[slot]
    mem = memoryview(self.arena.mem)[off:off + layout.slot_bytes]
    self.slot_read[slot] = self.io.submit(self._ranges(key, self._arena_addr + off, mem))
P.Pager._read_into_slot = read_into_slot
"""

# Compute from a slot without waiting for its read; the reader threads are slow (a busy
# disk), so the bytes are not there yet.
SLOT_BEFORE_READ = """
import engine.paging.expert_io as IO, engine.paging.pager as P
slow = IO.ExpertIO._read
def read(self, *a):
    time.sleep(0.003)
    return slow(self, *a)
IO.ExpertIO._read = read
def views_of(self, layer, d):
    layout = self.layouts[layer]
    if d.slot < 0:
        buf, h = self._transient[d.key]
        self._wait(h)
        return tuple(buf[p.offset_in_slot:p.offset_in_slot + p.stride].reshape(p.rows, p.row_bytes)
                     for p in layout.parts)
    return self.arena.expert_views(d.slot, layout, self.shape_id[layer])   # no wait
P.Pager._views_of = views_of
"""

# RMSNorm's sum of squares accumulated in per-thread partial sums: the result depends on the
# thread count (every other layer recomputes from the dumped input, so only the determinism
# layer can see it).
THREAD_DEPENDENT_SUM = """
import engine.ops as O, engine.kernels as K
good = O.rms_norm
def rms_norm(x, w, eps):
    t = K.get_threads()
    if t == 1:
        return good(x, w, eps)
    x = np.ascontiguousarray(x, dtype=np.float32)
    parts = np.array_split(x * x, t, axis=-1)
    ss = parts[0].sum(axis=-1, dtype=np.float32)
    for p in parts[1:]:
        ss = ss + p.sum(axis=-1, dtype=np.float32)
    scale = np.float32(1.0) / np.sqrt(ss / np.float32(x.shape[-1]) + np.float32(eps))
    return (x * scale[:, None] * w).astype(np.float32)
O.rms_norm = rms_norm
"""

# Work cut into equal shares per thread, the remainder of an uneven split lost (its output rows
# left zero): invisible wherever every size splits evenly at the thread count compared.
REMAINDER_LOST = """
import engine.kernels as K
ITEM = 16                       # output rows per work item
def lose_remainder(kernel):
    def run(ptrs, n_rows, row_bytes, act_rows, act_start, *rest):
        out = kernel(ptrs, n_rows, row_bytes, act_rows, act_start, *rest)
        workers, per = K.get_threads(), -(-n_rows // ITEM)
        total = len(ptrs) * per
        for i in range(total // workers * workers, total):
            m, r0 = divmod(i, per)
            out[act_start[m]:act_start[m + 1], r0 * ITEM:(r0 + 1) * ITEM] = 0
        return out
    return run
K._MATMUL = {q: lose_remainder(k) for q, k in K._MATMUL.items()}
"""

# A layer computes its experts in memory first, the rest once read (engine/model.py
# moe_output); here the second group's output rows land in each other's places.
LATE_EXPERTS_SWAPPED = """
import engine.model as M
good, seen = M.experts_ffn, {"a": None}
def experts_ffn(parts, types, a, rows_of):
    y = good(parts, types, a, rows_of)
    if seen["a"] is a:          # the layer's second call: the experts that were still being read
        y = y[::-1].copy()
    seen["a"] = a
    return y
M.experts_ffn = experts_ffn
"""

FAULT_SET: dict[str, Fault] = {
    # ---- kernel numerics
    "Q6_K products 0.2 % too large": Fault(Q6K_TOO_LARGE, "kernel numerics", "a Q6_K tensor"),
    "the avx2 k-quant product 0.1 % off": Fault("""
        import engine.kernels_x86 as A
        good = A.matmul_kquant
        A.matmul_kquant = lambda *a: good(*a) * np.float32(1.001)
    """, "kernel numerics", "a CPU with AVX2"),
    # ---- where the bytes come from
    "an expert read from its predecessor's bytes": Fault("""
        import engine.paging.arena as A
        good = A.LayerLayout.ranges
        A.LayerLayout.ranges = lambda self, expert: good(self, expert - 1 if expert > 0 else expert)
    """, "paging offsets"),
    "expert 2's down part read a page late": Fault("""
        import engine.paging.arena as A
        good = A.LayerLayout.ranges
        def ranges(self, expert):
            r = good(self, expert)
            if expert == 2:
                off, length, at = r[2]
                r[2] = (off + 4096, length, at)
            return r
        A.LayerLayout.ranges = ranges
    """, "paging offsets", "expert 2 routed"),
    "a prefetch reads the neighbouring expert's bytes": Fault("""
        import engine.paging.pager as P
        good_begin, good_read = P.Pager.begin_layer, P.Pager._read_into_slot
        PREFETCHING = [False]
        def begin_layer(self, il, x):
            PREFETCHING[0] = True
            try:
                return good_begin(self, il, x)
            finally:
                PREFETCHING[0] = False
        def _read_into_slot(self, key, slot):
            if PREFETCHING[0]:
                key = (key[0], (key[1] + 1) % self.gm.hp.n_expert)
            return good_read(self, key, slot)
        P.Pager.begin_layer, P.Pager._read_into_slot = begin_layer, _read_into_slot
    """, "prefetch"),
    "a large expert prefetched into a small slot": Fault(WRONG_SIZE_PREFETCH, "prefetch", "two expert sizes"),
    "a slot computed from before its read completed": Fault(SLOT_BEFORE_READ, "prefetch"),
    "the experts read late given each other's outputs": Fault(LATE_EXPERTS_SWAPPED, "prefetch",
                                                              "two experts of a layer still read at its lookup"),
    # a prediction issued late, after waiting for a full queue, reads the neighbouring expert:
    # only a run whose queue overflows with predictions that outlive their layer reaches it
    "a late-issued prefetch reads the neighbouring expert": Fault("""
        import engine.paging.prefetch as F, engine.paging.pager as P
        good_pump, good_read = F.PrefetchQueue.pump, P.Pager._read_into_slot
        LATE = set()
        def pump(self, n_outstanding, issue):
            seen = [self.late]
            def tagged(key, born):          # the queue counted it late just before issuing it
                if self.late > seen[0]:
                    LATE.add(key)
                seen[0] = self.late
                issue(key, born)
            return good_pump(self, n_outstanding, tagged)
        def _read_into_slot(self, key, slot):
            if key in LATE:
                LATE.discard(key)
                key = (key[0], (key[1] + 1) % self.gm.hp.n_expert)
            return good_read(self, key, slot)
        F.PrefetchQueue.pump, P.Pager._read_into_slot = pump, _read_into_slot
    """, "prefetch", "3 layers (a layer start between a prediction and its lookup)"),
    "two-layer-ahead prefetch reads the layer before": Fault("""
        import engine.paging.pager as P
        good = P.Pager._read_into_slot
        def _read_into_slot(self, key, slot):
            if self.cfg.prefetch_layer_ahead == 2 and key[0] == self.current_layer + 2:
                key = (key[0] - 1, key[1])
            return good(self, key, slot)
        P.Pager._read_into_slot = _read_into_slot
    """, "prefetch", "3 layers (a layer 2 ahead)"),
    # ---- cache policy: no logit changes, only the counters and predictions can show them
    "LRU order not updated on a hit": Fault("""
        import engine.paging.cache_policy as C
        C.CachePolicy.touch = lambda self, key: None
    """, "cache policy", "a hit followed by an eviction"),
    "a full prefetch queue silently drops a waiting prediction": Fault("""
        import engine.paging.prefetch as PF
        good = PF.PrefetchQueue.pump
        def pump(self, n_outstanding, issue):
            if self.pending and n_outstanding() >= self.cap:
                key, _ = self.pending.popleft()
                self._pending_keys.discard(key)
                self._waited.discard(key)
            return good(self, n_outstanding, issue)
        PF.PrefetchQueue.pump = pump
    """, "cache policy", "a prefetch queue that fills"),
    "predictions made with the current layer's router": Fault("""
        import engine.paging.prefetch as PF
        good = PF.Predictor.predict
        PF.Predictor.predict = lambda self, layer, x: good(self, max(layer - 1, 0), x)
    """, "cache policy", "2 layers"),
    # the dumped state is the one predicted from, so the router check and the replay agree
    # with it: only its comparison with the layer's real input shows it
    "predictions made from the previous micro-batch's hidden state": Fault("""
        import engine.paging.pager as P
        good, LAST = P.Pager.begin_layer, {}
        def begin_layer(self, il, x):
            prev = LAST.get(il)
            LAST[il] = np.array(x, copy=True)
            return good(self, il, prev if prev is not None and prev.shape == x.shape else x)
        P.Pager.begin_layer = begin_layer
    """, "cache policy", "2 micro-batches of one size"),
    "admission one lookup early": Fault("""
        import engine.paging.cache_policy as C
        good = C.CachePolicy.__init__
        def __init__(self, *a, **k):
            good(self, *a, **k)
            self.admit_min_hits = max(1, self.admit_min_hits - 1)
        C.CachePolicy.__init__ = __init__
    """, "cache policy", "an expert missed twice"),
    "evictions reported as 0": Fault("""
        import engine.paging.cache_policy as C
        good = C.CachePolicy.counters
        C.CachePolicy.counters = lambda self: {**good(self), "evictions": 0}
    """, "counters", "an eviction"),
    # ---- switch branches
    "transient buffer of a deferred admission reads the neighbouring expert": Fault("""
        import engine.paging.pager as P
        good = P.Pager._read_transient
        def _read_transient(self, key):
            wrong = (key[0], (key[1] + 1) % self.gm.hp.n_expert)
            kept = self._transient.pop(wrong, None)
            good(self, wrong)
            self._transient[key] = self._transient.pop(wrong)
            if kept is not None:
                self._transient[wrong] = kept
        P.Pager._read_transient = _read_transient
    """, "switch branch"),
    "hot pins loaded with the neighbouring expert's bytes": Fault("""
        import engine.paging.pager as P
        good = P.Pager.start
        def start(self):
            self.pins = [((k[0], (k[1] + 1) % self.gm.hp.n_expert), s) for k, s in self.pins]
            good(self)
        P.Pager.start = start
    """, "switch branch"),
    "serial reads put the up part's bytes into down": Fault("""
        import engine.paging.expert_io as IO
        good = IO.ExpertIO.submit
        def submit(self, ranges, *args, **kw):
            if not self.parallel and len(ranges) == 3:
                ranges = [ranges[0], ranges[1], (ranges[1][0], ranges[2][1], ranges[2][2], ranges[2][3])]
            return good(self, ranges, *args, **kw)
        IO.ExpertIO.submit = submit
    """, "switch branch"),
    "exact reads miss each part's last 32 bytes": Fault("""
        import engine.paging.arena as A
        good = A.part_window
        A.part_window = lambda off, stride, n, size, direct: good(off, stride, n, size, direct) if direct else (0, stride - 32)
    """, "switch branch"),
    # serial reads and fadvise ignored: the bytes and every counter are as in the default run,
    # so only the run's branch events can tell the switches had no effect
    "SDQ_IO_PARALLEL=0 and SDQ_FADV_DONTNEED=1 ignored": Fault("""
        import engine.paging.expert_io as IO
        good = IO.ExpertIO.__init__
        def __init__(self, path, threads=4, parallel=True, fadvise_dontneed=False, direct=True):
            good(self, path, threads, True, False, direct)
        IO.ExpertIO.__init__ = __init__
    """, "switch branch"),
    # the queue's cap not applied: nothing ever waits, so the queue's run never reaches its branch
    "SDQ_PREFETCH_QUEUE ignored": Fault("""
        import engine.paging.prefetch as F
        good = F.PrefetchQueue.__init__
        def __init__(self, cap, stale):
            good(self, 64, stale)
        F.PrefetchQueue.__init__ = __init__
    """, "switch branch", "a prefetch queue that fills"),
    "-b ignored": Fault("""
        import engine.runtime as R
        good = R.Engine.__init__
        def __init__(self, path, options=None):
            options.batch = 32
            good(self, path, options)
        R.Engine.__init__ = __init__
    """, "switch branch"),
    # ---- resource promises: a slot plan off by one in one layout
    "mixed arena: one small slot fewer than it holds": Fault(
        slot_fault("len(p.n_slots) == 2 and p.n_slots[0] > p.need[0]", "(p.n_slots[0] - 1, p.n_slots[1])"),
        "resource promise", "two expert sizes"),
    "uniform arena: one slot more than it holds": Fault(
        slot_fault("uniform", "(p.n_slots[0] + 1,)"), "resource promise"),
    # ---- threads
    "RMSNorm's sum split by thread": Fault(THREAD_DEPENDENT_SUM, "thread split"),
    "the remainder of an uneven work split lost": Fault(REMAINDER_LOST, "thread split"),
    # ---- memory and start-up
    "1 MiB kept every decoded token": Fault("""
        import engine.paging.pager as P
        KEPT, good = [], P.Pager.end_batch
        def end_batch(self, n_tokens):
            KEPT.append(np.ones(1 << 18, np.float32))
            return good(self, n_tokens)
        P.Pager.end_batch = end_batch
    """, "memory"),
    "a short read in the start-up warm-up": Fault("""
        import engine.runtime as R
        from engine.gguf_model import ModelError
        def warm_up(*a, **k):
            raise ModelError("token_embd.weight: short read (4096 of 8192 bytes)")
        R.warm_up = warm_up
    """, "start-up"),
    # ---- model math
    "layer 2's router nudged": Fault(ROUTER_NUDGED_IN_LAYER_2, "model math", "3 layers"),
    "recurrent state not carried across micro-batches": Fault("""
        import engine.deltanet as D
        good = D.gated_delta_rule
        def gated_delta_rule(q, k, v, decay, beta, S, scale):
            S[:] = 0                       # every micro-batch starts from a fresh state
            return good(q, k, v, decay, beta, S, scale)
        D.gated_delta_rule = gated_delta_rule
    """, "model math", "delta-net layers", "qwen35moe"),
    "the shared expert's gate dropped": Fault("""
        import engine.qwen35moe as Q
        good = Q.sigmoid
        Q.sigmoid = lambda x: np.ones_like(x) if np.shape(x)[-1] == 1 else good(x)
    """, "model math", "a shared expert", "qwen35moe"),
}
