"""The expert pager on the ci model (8 layers, 64 experts, top-4, two expert sizes).

Arenas of 10-25 % of the model's 118 MiB of experts, prefill micro-batch 8 (so the
minimum arena -- one layer's routed experts of a micro-batch, 32 small + 32 large slots --
is 15.75 MiB, 13.3 %). Runs are in-process (engine.runtime.Engine) except the CLI checks.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from engine.paging import expert_io
from engine.paging.arena import MiB
from engine.paging.config import PagerConfig
from engine.paging.pager import Pager
from engine.runtime import Engine, Options
from engine.selftest import run_selftest
from epmci.contract.cache_model import CacheModel, Lookup
from epmci.contract.outputs import STATS_FIELDS, STATS_MEASURED_FIELDS, read_selftest
from epmci.gguf.file import ModelFile
from epmci.synth.store import make_model
from epmci.reference.moe import expert_forward

PROMPT = "Experts are paged from disk into a small arena."
N_PREDICT = 8
BATCH = 8
N_CTX = 64
TIMING = tuple(STATS_MEASURED_FIELDS)


@pytest.fixture(scope="module")
def ci() -> str:
    return str(make_model("ci"))


@pytest.fixture(scope="module")
def sizes(ci):
    """Expert bytes and read bytes per layer, total expert MiB and the minimum arena (MiB) at
    BATCH, from the file and the contract's window rule (docs/engine-contract.md, Reads)."""
    mf = ModelFile(ci)
    per_layer = [mf.expert_bytes(il) for il in range(mf.hp.n_layer)]
    total = sum(per_layer) * mf.hp.n_expert
    assert sorted(set(per_layer)) == [237568, 254976]
    read_per_layer = []
    for il in range(mf.hp.n_layer):
        n = 0
        for part in ("gate", "up", "down"):
            r = mf.expert_range(il, 0, part)
            head = r.offset % 4096
            # a part of whole pages read as the aligned window covering it; Q6_K down is not
            n += -(-(head + r.n_bytes) // 4096) * 4096 if head and r.n_bytes % 4096 == 0 else r.n_bytes
        read_per_layer.append(n)
    assert sorted(set(read_per_layer)) == [3 * 4096 + 237568, 2 * 4096 + 254976]
    # 32 experts of one micro-batch, per class; windows (or exact parts) rounded up to 4096
    min_mib = 32 * (3 * 4096 + 237568 + 2 * 4096 + 258048) / MiB
    return {"per_layer": per_layer, "read_per_layer": read_per_layer, "total_mib": total / MiB,
            "min_mib": min_mib}


@dataclass
class Run:
    tokens: list[int]
    logits: np.ndarray
    records: list[dict]
    per_token: list[dict]          # cumulative counters after prefill and after each decode step
    routing: list[tuple[int, list[int]]]
    read_log: list | None
    pager: Pager | None
    bytes_read: int

    def exact(self) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in TIMING} for r in self.records]

    def total(self, field: str) -> int:
        return sum(r[field] for r in self.records)


def run(path: str, arena_mb=None, env=None, threads=1, pager=True, n_predict=N_PREDICT) -> Run:
    cfg = PagerConfig.from_env(arena_mb=arena_mb, env=env or {}) if pager else None
    eng = Engine(path, Options(n_ctx=N_CTX, threads=threads, batch=BATCH, pager=pager, pager_config=cfg))
    try:
        p = eng.experts if pager else None
        if p is not None:
            p.read_log = []
        routing: list = []
        eng.on_moe(lambda t: routing.append((t.layer, list(dict.fromkeys(t.selected.ravel().tolist())))))
        per_token: list = []
        toks = eng.encode_prompt(PROMPT, chat=False)
        gen, logits = eng.generate(toks, n_predict,
                                   on_token=lambda t: per_token.append(p.counters() if p else {}))
        return Run(gen, logits, eng.stats_records(), per_token, routing,
                   p.read_log if p else None, p, p.io.bytes_read if p else 0)
    finally:
        eng.close()


_CACHE: dict = {}


def cached(path, arena_mb=None, env=None, **kw) -> Run:
    key = (path, arena_mb, tuple(sorted((env or {}).items())), tuple(sorted(kw.items())))
    if key not in _CACHE:
        _CACHE[key] = run(path, arena_mb, env, **kw)
    return _CACHE[key]


@pytest.fixture(scope="module")
def resident(ci) -> Run:
    return cached(ci, pager=False)


def arena(sizes, what) -> float:
    if what == "min+":
        return round(sizes["min_mib"] + 0.01, 3)
    return round(sizes["total_mib"] * what, 3)


NOPF = {"SDQ_PREFETCH": "0"}
UNIFORM = {"SDQ_FORCE_UNIFORM_SLOT": "1"}
CONFIGS = {
    "mixed-15%-prefetch": (0.15, {}),
    "mixed-15%-no-prefetch": (0.15, NOPF),
    "uniform-15%-prefetch": (0.15, UNIFORM),
    "uniform-15%-no-prefetch": (0.15, {**UNIFORM, **NOPF}),
    "mixed-min+-prefetch": ("min+", {}),
    "mixed-min+-no-prefetch": ("min+", NOPF),
    "uniform-10%-prefetch": (0.10, UNIFORM),
    "mixed-25%-same-layer-prefetch": (0.25, {"SDQ_PREFETCH_LAYER_AHEAD": "0"}),
    "mixed-20%-admit2": (0.20, {"SDQ_ADMIT_MIN_HITS": "2"}),
    "mixed-15%-serial-io-fadvise": (0.15, {"SDQ_IO_PARALLEL": "0", "SDQ_IO_THREADS": "1",
                                           "SDQ_FADV_DONTNEED": "1"}),
    "mixed-15%-queue3-stale0": (0.15, {"SDQ_PREFETCH_QUEUE": "3", "SDQ_PREFETCH_STALE_TOKENS": "0"}),
    "mixed-15%-exact-reads": (0.15, {"SDQ_DIRECT_IO": "0"}),
}


# ---------------------------------------------------------------- A/B: paged == resident

@pytest.mark.parametrize("name", list(CONFIGS))
def test_paged_logits_byte_identical_to_resident(ci, sizes, resident, name, capfd):
    frac, env = CONFIGS[name]
    r = cached(ci, arena(sizes, frac), env)
    assert r.tokens == resident.tokens
    assert r.logits.tobytes() == resident.logits.tobytes()
    assert "SLOT-ERROR" not in capfd.readouterr().err
    # every read the pager issued is accounted for, byte for byte
    reads = [k for kind, k in r.read_log if kind in ("miss", "prefetch")]
    assert r.total("ssd_bytes") == sum(sizes["per_layer"][layer] for layer, _ in reads)
    read_bytes = sizes["per_layer" if env.get("SDQ_DIRECT_IO") == "0" else "read_per_layer"]
    assert r.total("io_bytes") == sum(read_bytes[layer] for layer, _ in reads) == r.bytes_read
    if env.get("SDQ_DIRECT_IO") == "0":   # exact reads, buffered
        assert all(rec["io_direct_pct"] == 0 for rec in r.records)
    elif r.pager.io.dfd >= 0:   # the file system takes O_DIRECT: the aligned windows use it
        assert all(rec["io_direct_pct"] > 50 for rec in r.records)
    assert r.total("misses") == sum(1 for kind, _ in r.read_log if kind == "miss")
    assert r.total("prefetch_issued") == sum(1 for kind, _ in r.read_log if kind == "prefetch")
    lookups = sum(len(es) for _, es in resident.routing)
    assert r.total("hits") + r.total("misses") == lookups
    for rec in r.records:
        assert tuple(rec) == STATS_FIELDS
        assert rec["arena_mb"] <= arena(sizes, frac) + 1e-9
        assert rec["n_slots"] == rec["n_slots_small"] + rec["n_slots_large"]
        if env.get("SDQ_PREFETCH") == "0":
            assert rec["prefetch_issued"] == 0
    if env.get("SDQ_FORCE_UNIFORM_SLOT") == "1":
        assert r.records[0]["n_slots_small"] == 0
    else:
        assert r.records[0]["n_slots_small"] >= r.records[0]["n_slots_large"] > 0


def test_prefetch_is_used(ci, sizes):
    r = cached(ci, arena(sizes, 0.15), {})
    dec = r.records[1]
    assert dec["phase"] == "decode" and dec["prefetch_issued"] > 0
    assert 0 < dec["prefetch_used"] <= dec["prefetch_issued"]
    off = cached(ci, arena(sizes, 0.15), NOPF)
    assert dec["hit_rate"] > off.records[1]["hit_rate"]


def test_resident_records_have_zero_paging_fields(resident):
    for rec in resident.records:
        assert tuple(rec) == STATS_FIELDS
        assert all(rec[k] == 0 for k in ("hits", "misses", "ssd_bytes", "n_slots", "prefetch_issued", "arena_mb"))


def test_minimum_arena_evicts_on_every_token(ci, sizes):
    for env in (NOPF, {}):
        r = cached(ci, arena(sizes, "min+"), env)
        assert (r.records[0]["n_slots_small"], r.records[0]["n_slots_large"]) == (32, 32)
        ev = [c["evictions"] for c in r.per_token]
        assert len(ev) == N_PREDICT and all(b > a for a, b in zip(ev, ev[1:]))


# ---------------------------------------------------------------- exact counters

def test_counters_identical_across_runs_threads_and_io(ci, sizes):
    a = cached(ci, arena(sizes, 0.15), {})
    b = run(ci, arena(sizes, 0.15), {})
    c = run(ci, arena(sizes, 0.15), {"SDQ_IO_THREADS": "1", "SDQ_IO_PARALLEL": "0",
                                     "SDQ_FADV_DONTNEED": "1"}, threads=2)
    # c's own switches count their branch events (serial reads, fadvised ranges); nothing else moves
    own = {"serial_reads", "fadvise_ranges"}
    assert a.exact() == b.exact()
    assert [{k: v for k, v in r.items() if k not in own} for r in a.exact()] == \
           [{k: v for k, v in r.items() if k not in own} for r in c.exact()]
    assert all(r["serial_reads"] > 0 and r["fadvise_ranges"] > 0 for r in c.exact())

    def exact(counters):   # io_direct_pct counts the reads completed when the snapshot is taken
        return {k: v for k, v in counters.items() if k not in STATS_MEASURED_FIELDS | own}
    for other in (b, c):
        assert [exact(x) for x in a.per_token] == [exact(x) for x in other.per_token]
    assert a.logits.tobytes() == c.logits.tobytes()


def test_counters_do_not_depend_on_io_timing(ci, sizes, resident, monkeypatch):
    """Reads complete late and out of order: same counters, same logits (so nothing was
    computed from a slot before its read completed)."""
    base = cached(ci, arena(sizes, 0.15), {})
    real = expert_io.ExpertIO._pread_all
    rng = random.Random(7)
    delays = [rng.choice((0.0, 0.0005, 0.002, 0.006)) for _ in range(4096)]
    counter = iter(range(10 ** 9))

    def slow(fd, offset, length, dest):
        import time
        time.sleep(delays[next(counter) % len(delays)])
        real(fd, offset, length, dest)

    monkeypatch.setattr(expert_io.ExpertIO, "_pread_all", staticmethod(slow))
    slow_run = run(ci, arena(sizes, 0.15), {"SDQ_IO_THREADS": "3"})
    assert slow_run.exact() == base.exact()
    assert slow_run.logits.tobytes() == resident.logits.tobytes()
    assert sum(r["io_wait_s"] for r in slow_run.records) > 0


def test_experts_in_memory_are_computed_while_the_others_are_read(ci, sizes, resident, monkeypatch):
    """A layer with hits and misses computes its hits first, then the misses once read (the
    first kernel call overlaps the reads): the same logits as the resident run."""
    import engine.model as M
    real_read, real_ffn, real_output = expert_io.ExpertIO._pread_all, M.experts_ffn, M.Model.moe_output
    calls, groups = [], []   # experts per kernel call; per paged layer lookup, its calls

    def slow(fd, offset, length, dest):
        import time
        time.sleep(0.002)
        real_read(fd, offset, length, dest)

    def ffn(parts, types, a, rows_of):
        calls.append(len(parts))
        return real_ffn(parts, types, a, rows_of)

    def output(self, r):
        first = len(calls)
        out = real_output(self, r)
        if not isinstance(r.views, M.InPlace):   # not the start-up warm-up's
            groups.append(calls[first:])
        return out
    monkeypatch.setattr(expert_io.ExpertIO, "_pread_all", staticmethod(slow))
    monkeypatch.setattr(M, "experts_ffn", ffn)
    monkeypatch.setattr(M.Model, "moe_output", output)
    r = run(ci, arena(sizes, 0.15), NOPF)
    assert r.logits.tobytes() == resident.logits.tobytes()
    assert [sum(g) for g in groups] == [len(experts) for _, experts in r.routing]
    # one call when every expert was in memory or none was, two otherwise
    assert {len(g) for g in groups} == {1, 2}


def _reference_lru(routing, n_slots, class_of_layer):
    """The contract's cache policy (epmci's independent model) on this run's routing:
    hits, and the misses in the order they must be read."""
    model = CacheModel(list(n_slots), list(class_of_layer), [0] * len(class_of_layer), need=0)
    c = model.run([Lookup("run", layer, experts) for layer, experts in routing])["run"]
    return c.hits, c.reads


@pytest.mark.parametrize("frac,env", [(0.15, NOPF), (0.10, {**UNIFORM, **NOPF}), ("min+", NOPF)])
def test_ssd_bytes_equal_the_missed_experts_bytes(ci, sizes, frac, env):
    r = cached(ci, arena(sizes, frac), env)
    plan = r.pager.plan
    hits, missed = _reference_lru(r.routing, plan.n_slots, plan.class_of_layer)
    assert (r.total("hits"), r.total("misses")) == (hits, len(missed))
    assert [k for _, k in r.read_log] == missed
    assert r.total("ssd_bytes") == sum(sizes["per_layer"][layer] for layer, _ in missed)
    assert r.total("io_bytes") == sum(sizes["read_per_layer"][layer] for layer, _ in missed) == r.bytes_read
    assert r.records[1]["ssd_bytes_per_token"] == round(r.records[1]["ssd_bytes"] / r.records[1]["tokens"], 3)


# ---------------------------------------------------------------- hot pins, profile

def test_hot_pin_from_profile(ci, sizes, resident, tmp_path):
    base = cached(ci, arena(sizes, 0.15), NOPF)
    text = base.pager.profile_text()
    lines = [tuple(map(int, l.split())) for l in text.splitlines()]
    assert lines == sorted(lines, key=lambda t: (-t[2], t[0], t[1]))
    assert sum(c for _, _, c in lines) == sum(len(es) for _, es in resident.routing)
    prof = tmp_path / "profile.txt"
    prof.write_text(text)
    r = run(ci, arena(sizes, 0.15), {**NOPF, "SDQ_HOT_PIN": "24", "SDQ_PROFILE_IN": str(prof)})
    assert r.logits.tobytes() == resident.logits.tobytes()
    pinned = [k for k, _ in r.pager.pins]
    # the 24 hottest, as far as each class keeps one micro-batch's worth of slots unpinned
    plan = r.pager.plan
    room = [n - need for n, need in zip(plan.n_slots, plan.need)]
    want = []
    for layer, e, _ in lines[:24]:
        k = plan.class_of_layer[layer]
        if room[k] > 0:
            want.append((layer, e))
            room[k] -= 1
    assert pinned == want and len(pinned) >= 8
    for key, slot in r.pager.pins:
        assert r.pager.policy.owner[slot] == key
    assert not any(k in pinned for _, k in r.read_log)      # never missed, never re-read
    assert r.total("hits") > base.total("hits")


# ---------------------------------------------------------------- selftest

@pytest.mark.parametrize("layer,expert,n", [(0, 5, 3), (5, 63, 2), (7, 0, 1)])
def test_selftest_matches_reference(ci, sizes, tmp_path, layer, expert, n):
    cfg = PagerConfig.from_env(arena_mb=arena(sizes, 0.15), env={"SDQ_ADMIT_MIN_HITS": "3"})
    eng = Engine(ci, Options(n_ctx=N_CTX, batch=BATCH, pager_config=cfg))
    try:
        out = tmp_path / "selftest.bin"
        info = run_selftest(eng, f"{layer}:{expert}:{n}:{out}")
        assert 0 <= info["slot"] < eng.experts.plan.total_slots
        assert eng.experts.read_log is None and eng.experts.counters()["misses"] == 1
    finally:
        eng.close()
    mf = ModelFile(ci)
    # the gate's reader: version, layer, expert, rows and width checked, or ContractError
    got = read_selftest(out, layer=layer, expert=expert, n_rows=n, n_embd=mf.hp.n_embd)
    x = np.random.default_rng([layer, expert, n]).standard_normal((n, mf.hp.n_embd)).astype(np.float32)
    assert got.x.tobytes() == x.tobytes()
    ref = expert_forward(mf, layer, expert, x)
    assert got.y.tobytes() == np.ascontiguousarray(ref, dtype=np.float32).tobytes()
    file_bytes = b"".join(np.ascontiguousarray(mf.read_expert(layer, expert, p)).tobytes()
                          for p in ("gate", "up", "down"))
    assert got.slot_sha256 == hashlib.sha256(file_bytes).digest()


# ---------------------------------------------------------------- slot errors

def test_wrong_slot_class_is_a_slot_error(ci, sizes, capfd):
    cfg = PagerConfig.from_env(arena_mb=arena(sizes, 0.15), env=NOPF)
    eng = Engine(ci, Options(n_ctx=N_CTX, batch=BATCH, pager_config=cfg))
    try:
        p = eng.experts
        small_slot = 0
        assert p.plan.class_of_layer[5] == 1 and p.arena.slot_class[small_slot] == 0
        with pytest.raises(RuntimeError, match="SLOT-ERROR"):
            p._read_into_slot((5, 0), small_slot)       # a large expert into a small slot
        err = capfd.readouterr().err
        assert err.startswith("[epm] SLOT-ERROR") and err.count("\n") == 1
    finally:
        eng.close()


# ---------------------------------------------------------------- CLI

def cli(args, env=None, cwd=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True,
                          env=e, cwd=cwd, timeout=300)


def _one_line_error(p):
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("epm-engine: error: "), p.stderr
    return lines[0]


def test_cli_refuses_an_arena_below_the_minimum(ci, tmp_path):
    line = _one_line_error(cli(["-m", ci, "-p", PROMPT, "-b", str(BATCH), "--arena-mb", "15"], cwd=tmp_path))
    assert "below the minimum 15.75 MiB" in line
    line = _one_line_error(cli(["-m", ci, "-p", PROMPT, "-b", str(BATCH), "--arena-mb", "40"],
                               env={"SDQ_ARENA_MB": "7", "SDQ_FORCE_UNIFORM_SLOT": "1"}, cwd=tmp_path))
    assert "arena 7.00 MiB is below the minimum 8.12 MiB" in line


def test_cli_refuses_bad_settings(ci, tmp_path):
    line = _one_line_error(cli(["-m", ci, "-p", PROMPT], env={"SDQ_IO_THREADS": "0"}, cwd=tmp_path))
    assert "SDQ_IO_THREADS" in line
    line = _one_line_error(cli(["-m", ci, "-p", PROMPT], env={"SDQ_HOT_PIN": "4"}, cwd=tmp_path))
    assert "SDQ_PROFILE_IN" in line


def test_cli_budget_refusal_and_peak_rss_under_budget(ci, sizes, resident, tmp_path):
    base = ["-m", ci, "-p", PROMPT, "--no-chat", "-n", str(N_PREDICT), "-c", str(N_CTX),
            "-b", str(BATCH), "--arena-mb", str(arena(sizes, 0.15))]
    line = _one_line_error(cli(base + ["--ram-budget-mb", "40"], cwd=tmp_path))
    m = re.search(r"needs ([\d.]+) MiB \(resident weights [\d.]+ \+ arena [\d.]+ \+ KV cache [\d.]+ "
                  r"\+ work buffers [\d.]+ \+ runtime [\d.]+ MiB\)", line)
    assert m, line
    budget = math.ceil(float(m.group(1))) + 2
    stats, logits, prof = tmp_path / "s.jsonl", tmp_path / "l.bin", tmp_path / "prof.txt"
    for attempt in range(2):
        # The budget assumes compiled kernels come from numba's on-disk cache; if the
        # engine's sources changed since, the first run compiles (hundreds of MiB of LLVM
        # state) and refills the cache, so it is measured once more.
        stats.unlink(missing_ok=True)
        p = cli(base + ["--ram-budget-mb", str(budget), "--stats-file", str(stats), "--dump-logits",
                        "--logits-out", str(logits), "--profile-out", str(prof)], cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        assert "SLOT-ERROR" not in p.stderr
        recs = [json.loads(l) for l in stats.read_text().splitlines()]
        if max(r["peak_rss_mb"] for r in recs) < budget:
            break
    assert [r["phase"] for r in recs] == ["prefill", "decode"]
    for r in recs:
        assert tuple(r) == STATS_FIELDS
        assert 0 < r["peak_rss_mb"] < budget
    assert logits.read_bytes()[4:] == resident.logits.astype("<f4").tobytes()
    # the same counters as the in-process run with the same settings
    assert [{k: v for k, v in r.items() if k not in TIMING} for r in recs] == \
        cached(ci, arena(sizes, 0.15), {}).exact()
    assert prof.read_text() == cached(ci, arena(sizes, 0.15), {}).pager.profile_text()


def test_cli_selftest(ci, sizes, tmp_path):
    out = tmp_path / "st.bin"
    p = cli(["-m", ci, "-b", str(BATCH), "--arena-mb", str(arena(sizes, 0.15)),
             "--selftest", f"5:3:2:{out}"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    got = read_selftest(out, layer=5, expert=3, n_rows=2)
    mf = ModelFile(ci)
    assert got.y.tobytes() == expert_forward(mf, 5, 3, got.x).astype(np.float32).tobytes()
    line = _one_line_error(cli(["-m", ci, "--selftest", f"9:0:1:{out}"], cwd=tmp_path))
    assert "layer 9 out of range" in line
    # several in one process (feature selftest_batch): each as if alone; one out of range
    # refuses them all before any is written
    a, b, c = (tmp_path / f"{n}.bin" for n in "abc")
    p = cli(["-m", ci, "-b", str(BATCH), "--arena-mb", str(arena(sizes, 0.15)),
             "--selftest", f"5:3:2:{a}", "--selftest", f"0:63:1:{b}"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert read_selftest(a, layer=5, expert=3, n_rows=2).y.tobytes() == got.y.tobytes()
    other = read_selftest(b, layer=0, expert=63, n_rows=1)
    assert other.y.tobytes() == expert_forward(mf, 0, 63, other.x).astype(np.float32).tobytes()
    line = _one_line_error(cli(["-m", ci, "--selftest", f"5:3:2:{c}", "--selftest", f"9:0:1:{out}"], cwd=tmp_path))
    assert "layer 9 out of range" in line and not c.exists()


# ---------------------------------------------------------------- reads

def test_expert_io_direct_when_aligned_else_buffered(tmp_path):
    import mmap
    data = np.random.default_rng(0).integers(0, 256, 5 * 4096 + 100, dtype=np.uint8)
    f = tmp_path / "blob.bin"
    f.write_bytes(data.tobytes())
    buf = mmap.mmap(-1, 3 * 4096)
    arr = np.frombuffer(buf, dtype=np.uint8)
    addr = arr.ctypes.data
    io = expert_io.ExpertIO(f, threads=2, parallel=True, fadvise_dontneed=True)
    try:
        mv = memoryview(buf)
        h = io.submit([(4096, 8192, mv[0:8192], addr),            # aligned: O_DIRECT if allowed
                       (8292, 100, mv[8192:8292], addr + 8192)])  # unaligned: buffered
        assert h.wait() >= 0 and h.done
        assert arr[:8192].tobytes() == data[4096:12288].tobytes()
        assert arr[8192:8292].tobytes() == data[8292:8392].tobytes()
        assert io.bytes_read == 8292
        assert io.reads_buffered >= 1 and io.reads_direct + io.reads_buffered == 2
        if io.dfd >= 0:
            assert io.reads_direct == 1
        with pytest.raises(OSError, match="short read"):
            io.submit([(len(data) - 10, 100, mv[0:100], addr)]).wait()
    finally:
        io.close()


def test_expert_io_starts_the_reads_needed_soonest_first(tmp_path):
    """A layer's misses go before the next layer's prefetches queued a moment earlier (the
    computation waits for the misses); among reads due at once, first come first served."""
    import threading
    f = tmp_path / "blob.bin"
    f.write_bytes(bytes(range(256)) * 64)
    io = expert_io.ExpertIO(f, threads=1, parallel=True, direct=False)
    started, hold = [], threading.Event()
    real = io._read

    def read(offset, length, dest, addr):
        if not started:
            hold.wait(10)   # the one reader is busy while the rest queue up
        started.append(offset)
        real(offset, length, dest, addr)
    io._read = read
    buf = bytearray(16)
    mv = memoryview(buf)
    try:
        first = io.submit([(0, 1, mv[0:1], 0)])
        hs = [io.submit([(off, 1, mv[i + 1:i + 2], 0)], defer=True, due=due)
              for i, (off, due) in enumerate([(10, (3, 5)), (20, (3, 4)), (30, (3, 5)), (40, (2, 9)), (50, (3, 4))])]
        io.flush()
        hold.set()
        for h in [first, *hs]:
            h.wait()
    finally:
        io.close()
    assert started == [0, 40, 20, 50, 10, 30]


def test_the_pager_dates_each_read_by_the_layer_that_needs_it(ci, sizes, monkeypatch):
    """Misses are due at their own layer, prefetches at the layer they were predicted for,
    both in the current micro-batch: so a layer's misses start before later layers' prefetches."""
    dues = []
    real = expert_io.ExpertIO.submit

    def submit(self, ranges, defer=False, due=()):
        dues.append(due)
        return real(self, ranges, defer, due)
    monkeypatch.setattr(expert_io.ExpertIO, "submit", submit)
    r = run(ci, arena(sizes, 0.15), {}, n_predict=3)
    reads = [(kind, key) for kind, key in r.read_log if kind in ("miss", "prefetch")]
    assert len(dues) == len(reads) and {kind for kind, _ in reads} == {"miss", "prefetch"}
    assert all(due[1] == key[0] for due, (_, key) in zip(dues, reads))
    clocks = [due[0] for due in dues]
    assert clocks == sorted(clocks) and len(set(clocks)) > 1


@pytest.mark.parametrize("offset,stride,n_expert,file_size,direct,want", [
    (2496, 73728, 64, 10**9, True, (2496, 77824)),    # whole pages, misaligned: one page more
    (2496, 73728, 64, 10**9, False, (0, 73728)),      # SDQ_DIRECT_IO=0: exact
    (8192, 73728, 64, 10**9, True, (0, 73728)),       # already aligned: exact is the window
    (2720, 53760, 8, 10**9, True, (0, 53760)),        # not whole pages (Q6_K down): exact
    # the last expert's window would pass the end of the file: exact
    (2496, 73728, 2, 2496 + 2 * 73728 + 100, True, (0, 73728)),
    (2496, 73728, 2, 2496 - 2496 + 77824 + 73728, True, (2496, 77824)),   # ends exactly at EOF
])
def test_part_window_rule(offset, stride, n_expert, file_size, direct, want):
    from engine.paging.arena import part_window
    from epmci.gguf.facts import slot_part_bytes
    assert part_window(offset, stride, n_expert, file_size, direct) == want
    # epmci's model of the rule (for the minimum arena) agrees with the engine's
    assert slot_part_bytes(offset, stride, n_expert, file_size, 4096, direct) == -(-want[1] // 4096) * 4096


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("uniform", [False, True])
def test_epmci_minimum_arena_equals_the_engines(ci, direct, uniform):
    """epmci computes the stress arenas from the file (run.slot_align, run.slot_windows); with
    the engine's matching SDQ_DIRECT_IO both must give the same minimum, or the stress runs
    are refused or stop stressing."""
    from engine.paging.arena import layer_layouts, plan_slots
    from engine.gguf_model import GGUFModel
    from epmci.gguf.facts import ModelFacts
    gm = GGUFModel(ci)
    plan = plan_slots(layer_layouts(gm, direct), gm.hp.n_expert, gm.hp.n_expert_used, 2, 1 << 40, uniform)
    facts = ModelFacts.of(ModelFile(ci), 4096, windows=direct)
    assert facts.min_arena_bytes(2, uniform) == plan.min_bytes
    assert sorted(set(facts.slot_bytes)) == sorted(set(l.slot_bytes for l in layer_layouts(gm, direct)))


def test_o_direct_refused_at_read_time_falls_back_to_buffered(ci, sizes, resident, monkeypatch):
    """A file system that opens with O_DIRECT but refuses the reads (EINVAL): the same
    windows are read buffered, outputs and exact counters unchanged."""
    base = cached(ci, arena(sizes, 0.15), {})
    direct_fds: set[int] = set()
    real_init, real_preadv = expert_io.ExpertIO.__init__, os.preadv

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        direct_fds.add(self.dfd)

    def preadv(fd, bufs, offset):
        if fd >= 0 and fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, offset)

    monkeypatch.setattr(expert_io.ExpertIO, "__init__", init)
    monkeypatch.setattr(expert_io.os, "preadv", preadv)
    r = run(ci, arena(sizes, 0.15), {})
    assert r.logits.tobytes() == resident.logits.tobytes()
    assert r.exact() == base.exact()
    assert r.pager.io.reads_direct == 0 and r.pager.io.dfd == -1
    assert all(rec["io_direct_pct"] == 0 for rec in r.records)


def test_pager_reads_land_in_their_slots(ci, sizes):
    """Every resident entry's slot holds exactly the expert's file bytes after a run."""
    cfg = PagerConfig.from_env(arena_mb=arena(sizes, 0.15), env={"SDQ_IO_THREADS": "3"})
    eng = Engine(ci, Options(n_ctx=N_CTX, batch=BATCH, pager_config=cfg))
    try:
        eng.generate(eng.encode_prompt(PROMPT, chat=False), 3)
        p = eng.experts
        mf = ModelFile(ci)
        assert len(p.policy.where) == p.plan.total_slots
        for (layer, e), slot in sorted(p.policy.where.items()):
            h = p.slot_read[slot]
            if h is not None:
                h.wait()
            views = p.arena.expert_views(slot, p.layouts[layer], p.shape_id[layer])
            for v, part in zip(views, ("gate", "up", "down")):
                assert v.tobytes() == np.ascontiguousarray(mf.read_expert(layer, e, part)).tobytes()
    finally:
        eng.close()


def test_cli_default_arena_shrinks_to_fit_the_budget(ci, sizes, resident, tmp_path):
    """With --ram-budget-mb and no --arena-mb the default arena (25 % of the expert bytes)
    gives way to what the budget leaves after everything else, never below the minimum;
    a budget even the minimum arena cannot meet is refused with the numbers."""
    base = ["-m", ci, "-p", PROMPT, "--no-chat", "-n", str(N_PREDICT), "-c", str(N_CTX), "-b", str(BATCH)]
    base += ["--dump-logits", "--logits-out", str(tmp_path / "l.bin")]
    stats = tmp_path / "free.jsonl"
    assert cli(base + ["--stats-file", str(stats)], cwd=tmp_path).returncode == 0
    free = json.loads(stats.read_text().splitlines()[0])
    assert free["arena_mb"] >= 0.25 * sizes["total_mib"] - 1
    budget = round(free["ram_need_mb"] - 0.3 * free["arena_mb"])   # room for ~70 % of the default
    stats = tmp_path / "capped.jsonl"
    p = cli(base + ["--ram-budget-mb", str(budget), "--stats-file", str(stats)], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rec = json.loads(stats.read_text().splitlines()[0])
    assert sizes["min_mib"] <= rec["arena_mb"] < free["arena_mb"]
    assert rec["ram_need_mb"] <= budget
    assert (tmp_path / "l.bin").read_bytes()[4:] == resident.logits.astype("<f4").tobytes()
    line = _one_line_error(cli(base + ["--ram-budget-mb", str(round(free["ram_need_mb"] - free["arena_mb"]))],
                               cwd=tmp_path))
    assert re.search(r"needs [\d.]+ MiB \(resident weights [\d.]+ \+ arena [\d.]+ \+", line), line


# The engine as `python -m engine`, on a machine whose memory is LIMIT_MIB (its
# engine.machine.memory_limit wrapped: the cgroup files cannot be faked for a subprocess).
ON_A_SMALLER_MACHINE = """
import sys
import engine.machine
engine.machine.memory_limit = lambda: (int(float(sys.argv[1]) * 2**20), "its cgroup's memory limit")
from engine.cli import main
sys.exit(main(sys.argv[2:]))
"""


def cli_with_memory(limit_mib: float, args, cwd):
    return subprocess.run([sys.executable, "-c", ON_A_SMALLER_MACHINE, str(limit_mib), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


def test_cli_sizes_itself_from_the_memory_it_has(ci, sizes, resident, tmp_path):
    """Without --ram-budget-mb the budget is the memory the engine has (its cgroup's limit,
    else MemTotal): the default arena gives way to it with the same logits, the sizes it
    picked are said on stderr, and a machine too small even for the minimum arena is one
    line naming that memory."""
    base = ["-m", ci, "-p", PROMPT, "--no-chat", "-n", str(N_PREDICT), "-c", str(N_CTX), "-b", str(BATCH)]
    base += ["--dump-logits", "--logits-out", str(tmp_path / "l.bin")]
    stats = tmp_path / "free.jsonl"
    p = cli(base + ["--stats-file", str(stats)], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert re.search(r"\[epm\] picked: \d+ threads .*RAM budget [\d,]+ MiB \((its cgroup's memory limit|the "
                     r"machine's MemTotal)\), arena", p.stderr), p.stderr
    free = json.loads(stats.read_text().splitlines()[0])
    assert free["arena_mb"] >= 0.25 * sizes["total_mib"] - 1
    limit = round(free["ram_need_mb"] - 0.3 * free["arena_mb"])
    stats = tmp_path / "small.jsonl"
    p = cli_with_memory(limit, base + ["--stats-file", str(stats), "-t", "1"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rec = json.loads(stats.read_text().splitlines()[0])
    assert sizes["min_mib"] <= rec["arena_mb"] < free["arena_mb"] and rec["ram_need_mb"] <= limit
    assert f"RAM budget {limit:,} MiB (its cgroup's memory limit)" in p.stderr and "threads" not in p.stderr
    assert (tmp_path / "l.bin").read_bytes()[4:] == resident.logits.astype("<f4").tobytes()
    too_small = round(free["ram_need_mb"] - free["arena_mb"])
    line = _one_line_error(cli_with_memory(too_small, base, cwd=tmp_path))
    assert f"the engine's memory, {too_small:,} MiB (its cgroup's memory limit; --ram-budget-mb sets another): " \
           "needs" in line, line


def test_logits_are_kept_only_when_asked(ci, resident, tmp_path):
    """Without --dump-logits the engine computes and keeps only the logits sampling needs
    (at a 248k-token vocabulary a prompt's logits are gigabytes): the same tokens, and a
    smaller need."""
    base = ["-m", ci, "-p", PROMPT, "--no-chat", "-n", str(N_PREDICT), "-c", str(N_CTX), "-b", str(BATCH), "--no-pager"]
    kept = cli(base + ["--dump-logits", "--logits-out", str(tmp_path / "l.bin")], cwd=tmp_path)
    lean = cli(base, cwd=tmp_path)
    assert kept.returncode == lean.returncode == 0, kept.stderr + lean.stderr
    assert kept.stdout == lean.stdout and lean.stdout.strip()
    from engine.gguf_model import GGUFModel
    from engine.paging import budget
    gm = GGUFModel(ci)
    assert budget.work_buffer_bytes(gm, BATCH, N_CTX, keep_logits=False) < \
        budget.work_buffer_bytes(gm, BATCH, N_CTX, keep_logits=True)
