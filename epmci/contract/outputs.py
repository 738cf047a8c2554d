"""Readers of what an engine writes under docs/engine-contract.md: logits, MoE dumps,
prefetch dumps, delta-net state dumps, selftest files, stats JSONL and SLOT-ERROR lines.

Every reader validates sizes and headers and raises ContractError with the file and what is
wrong; a check turns that into a failure ("unparsable output"), never a pass.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MOE_DUMP_MAGIC = b"EPMD"
SELFTEST_MAGIC = b"EPMS"
STATE_DUMP_MAGIC = b"EPMR"
PREFETCH_DUMP_MAGIC = b"EPMP"
VERSION = 1
MOE_DUMP_VERSION_SHARED = 2   # MoE dump records that carry the shared expert's output
SLOT_ERROR_PREFIX = "[epm] SLOT-ERROR"
MAX_FILE_BYTES = 2 << 30      # the largest engine output file epmci reads (see _read)
# Every field of a stats record, in the contract's order (docs/engine-contract.md, Stats).
# Branch events: how often each paging switch's own code path ran (exact counters).
BRANCH_EVENTS = ("transient_reads", "pinned_hits", "prefetch_predictions", "prefetch_layers_ahead",
                 "prefetch_queued", "prefetch_late", "prefetch_dropped", "prefetch_stale", "serial_reads",
                 "fadvise_ranges")
STATS_FIELDS = ("phase", "tokens", "seconds", "tok_s", "hit_rate", "hits", "misses", "evictions",
                "ssd_bytes", "ssd_bytes_per_token", "io_bytes", "n_slots", "n_slots_small", "n_slots_large",
                "prefetch_issued", "prefetch_used", "prefetch_used_rate", "io_wait_s", "io_direct_pct",
                "arena_mb", "ram_need_mb", *BRANCH_EVENTS, "peak_rss_mb", "vm_swap_mb")
# What every engine writes; the other fields are the pager's, which an engine without one omits.
STATS_CORE_FIELDS = ("phase", "tokens", "seconds", "tok_s", "peak_rss_mb", "vm_swap_mb")
# Stats fields that are timings or measurements of the process and machine (io_direct_pct
# depends on whether the file system takes O_DIRECT, ram_need_mb on the process's RSS); every
# other field is an exact counter.
STATS_MEASURED_FIELDS = frozenset({"seconds", "tok_s", "io_wait_s", "io_direct_pct", "ram_need_mb",
                                   "peak_rss_mb", "vm_swap_mb"})


# Fields whose values are decimals (rates, sizes in MiB, timings); every other documented
# field counts something and is a whole number.
STATS_DECIMAL_FIELDS = frozenset({"seconds", "tok_s", "hit_rate", "ssd_bytes_per_token", "prefetch_used_rate",
                                  "io_wait_s", "io_direct_pct", "arena_mb", "ram_need_mb", "peak_rss_mb",
                                  "vm_swap_mb"})
STATS_PHASES = ("prefill", "decode")   # in this order, each at most once; prefill always


def stats_fields(pager: bool) -> tuple[str, ...]:
    """The fields every stats record of an engine with (or without) a pager must have."""
    return STATS_FIELDS if pager else STATS_CORE_FIELDS


class ContractError(Exception):
    """An engine output file is missing or does not follow the contract."""

    def __init__(self, path: object, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{Path(self.path).name}: {problem}")


def _read(path: str | os.PathLike) -> bytes:
    """An engine's output file, whole -- unless it is larger than any the contract lets a
    run write (MAX_FILE_BYTES): a failure, not epmci's memory exhausted by one read."""
    p = Path(path)
    if not p.exists():
        raise ContractError(p, "missing (the engine did not write it)")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ContractError(p, f"{size / 2**30:.1f} GiB, more than any output of a run can be "
                               f"({MAX_FILE_BYTES / 2**30:g} GiB: a full-context run's logits of a 248k vocabulary "
                               f"are 0.5 GiB); not read")
    return p.read_bytes()


# ------------------------------------------------------------------------ logits

def read_logits(path: str | os.PathLike) -> np.ndarray:
    """int32 n_vocab, then float32[rows][n_vocab] -> (rows, n_vocab)."""
    b = _read(path)
    if len(b) < 4:
        raise ContractError(path, f"logits file of {len(b)} bytes has no header")
    (n_vocab,) = struct.unpack_from("<i", b, 0)
    if n_vocab <= 0:
        raise ContractError(path, f"bad n_vocab {n_vocab}")
    body = len(b) - 4
    if body % (4 * n_vocab):
        raise ContractError(path, f"{body} bytes of logits is not a whole number of rows of {n_vocab}")
    rows = np.frombuffer(b, dtype="<f4", offset=4).reshape(-1, n_vocab)
    bad = ~np.isfinite(rows)
    if bad.any():   # no forward of a valid model gives one; compared, it would only read as a KL of nan
        r, c = np.argwhere(bad)[0]
        raise ContractError(path, f"{int(bad.sum())} non-finite logit(s), the first at row {r}, token {c}: {rows[r, c]}")
    return rows


# ------------------------------------------------------------------------ MoE dump

@dataclass
class MoERecord:
    layer: int
    h: np.ndarray         # (n, n_embd) float32
    selected: np.ndarray  # (n, k) int32
    weights: np.ndarray   # (n, k) float32
    out: np.ndarray       # (n, n_embd) float32: the routed experts' weighted sum
    shared: np.ndarray | None = None   # (n, n_embd) float32: the gated shared expert (version 2)


@dataclass
class MoEDump:
    layer: int
    records: list[MoERecord]

    @property
    def n_rows(self) -> int:
        return sum(len(r.h) for r in self.records)

    def concat(self) -> MoERecord:
        """All micro-batches as one record (the MoE block is row-independent)."""
        if not self.records:
            raise ValueError("empty dump")
        cat = lambda name: np.concatenate([getattr(r, name) for r in self.records])
        return MoERecord(self.layer, cat("h"), cat("selected"), cat("weights"), cat("out"),
                         cat("shared") if self.records[0].shared is not None else None)


def _record_header(b: bytes, pos: int, path, magic: bytes, n: int) -> tuple[int, ...]:
    """The n uint32 after a dump record's magic at byte pos."""
    if len(b) - pos < 4 + 4 * n:
        raise ContractError(path, f"truncated record header at byte {pos}")
    if b[pos:pos + 4] != magic:
        raise ContractError(path, f"bad magic {b[pos:pos + 4]!r} at byte {pos} (expected {magic!r})")
    return struct.unpack_from(f"<{n}I", b, pos + 4)


def read_moe_dump(path: str | os.PathLike, layer: int | None = None,
                  n_embd: int | None = None, k: int | None = None) -> MoEDump:
    """PREFIX.L: a sequence of records (see the contract), version 1 (routed experts) or 2
    (and the shared expert's output), all of one version. Checks each header against the
    expected layer / n_embd / k when given."""
    b = _read(path)
    recs: list[MoERecord] = []
    pos, hdr = 0, 4 + 5 * 4
    while pos < len(b):
        version, lay, n, e, kk = _record_header(b, pos, path, MOE_DUMP_MAGIC, 5)
        if version not in (VERSION, MOE_DUMP_VERSION_SHARED):
            raise ContractError(path, f"record at byte {pos}: version {version}, expected "
                                      f"{VERSION} or {MOE_DUMP_VERSION_SHARED}")
        if recs and (version == MOE_DUMP_VERSION_SHARED) != (recs[0].shared is not None):
            raise ContractError(path, f"record at byte {pos}: version {version} after records of another version")
        for name, got, want in (("layer", lay, layer), ("n_embd", e, n_embd), ("k", kk, k)):
            if want is not None and got != want:
                raise ContractError(path, f"record at byte {pos}: {name} {got}, expected {want}")
        if n == 0 or e == 0 or kk == 0:
            raise ContractError(path, f"record at byte {pos}: empty (n_rows {n}, n_embd {e}, k {kk})")
        has_shared = version == MOE_DUMP_VERSION_SHARED
        size = 4 * (n * e + n * kk + n * kk + n * e + (n * e if has_shared else 0))
        if len(b) - pos - hdr < size:
            raise ContractError(path, f"record at byte {pos}: truncated ({len(b) - pos - hdr} of {size} bytes)")
        a = pos + hdr
        h = np.frombuffer(b, "<f4", n * e, a).reshape(n, e)
        a += 4 * n * e
        sel = np.frombuffer(b, "<i4", n * kk, a).reshape(n, kk)
        a += 4 * n * kk
        w = np.frombuffer(b, "<f4", n * kk, a).reshape(n, kk)
        a += 4 * n * kk
        out = np.frombuffer(b, "<f4", n * e, a).reshape(n, e)
        a += 4 * n * e
        shared = np.frombuffer(b, "<f4", n * e, a).reshape(n, e) if has_shared else None
        recs.append(MoERecord(lay, h, sel, w, out, shared))
        pos = a + (4 * n * e if has_shared else 0)
    if not recs:
        raise ContractError(path, "empty dump (no records)")
    return MoEDump(recs[0].layer, recs)


@dataclass
class Prediction:
    layer: int             # made at the start of this layer
    target: int            # for this layer's lookup
    x: np.ndarray          # (n_rows, n_embd) float32: the hidden state it was made from
    selected: np.ndarray   # (n_rows, k) int32: each row's top-k of target's router, selection order

    def keys(self) -> list[tuple[int, int]]:
        """The (layer, expert) pairs predicted, distinct, in first-use order."""
        return [(self.target, int(e)) for e in dict.fromkeys(self.selected.ravel().tolist())]


def read_prefetch_dump(path: str | os.PathLike, n_layer: int, n_embd: int, k: int) -> list[Prediction]:
    """SDQ_PREFETCH_DUMP=PATH: one record per prediction, in the order made (none: an empty
    file). Every header checked against the model."""
    b = _read(path)
    out: list[Prediction] = []
    pos, hdr = 0, 4 + 6 * 4
    while pos < len(b):
        version, lay, target, n, e, kk = _record_header(b, pos, path, PREFETCH_DUMP_MAGIC, 6)
        if version != VERSION:
            raise ContractError(path, f"record at byte {pos}: version {version}, expected {VERSION}")
        if not (lay <= target < n_layer) or n == 0 or e != n_embd or kk != k:
            raise ContractError(path, f"record at byte {pos}: layer {lay}, target {target}, {n} rows, n_embd {e}, "
                                      f"k {kk} (the model: {n_layer} layers, n_embd {n_embd}, k {k})")
        size = 4 * (n * e + n * kk)
        if len(b) - pos - hdr < size:
            raise ContractError(path, f"record at byte {pos}: truncated ({len(b) - pos - hdr} of {size} bytes)")
        a = pos + hdr
        x = np.frombuffer(b, "<f4", n * e, a).reshape(n, e)
        sel = np.frombuffer(b, "<i4", n * kk, a + 4 * n * e).reshape(n, kk)
        out.append(Prediction(lay, target, x, sel))
        pos = a + size
    return out


def read_routing(prefix: str | os.PathLike, n_layer: int, n_embd: int, k: int) -> list[np.ndarray]:
    """The routed experts of every evaluated row, per layer: PREFIX.0 .. PREFIX.(n_layer-1)
    of a MoE dump, each (rows, k) int32 in the engine's selection order."""
    return [read_moe_dump(f"{prefix}.{il}", layer=il, n_embd=n_embd, k=k).concat().selected.copy()
            for il in range(n_layer)]


# ------------------------------------------------------------------------ delta-net state dump

@dataclass
class StateRecord:
    layer: int
    pos0: int           # position of the micro-batch's first row
    n_rows: int
    conv: np.ndarray    # (conv_dim, Kc-1) float32: the last Kc-1 pre-conv inputs, oldest first
    ssm: np.ndarray     # (V, ds, ds) float32: [j, m, i] = S_j[i][m]

    @property
    def position(self) -> int:
        """The position after which this is the state (the micro-batch's last row)."""
        return self.pos0 + self.n_rows - 1


def read_state_dump(path: str | os.PathLike, layer: int, conv_shape: tuple[int, int],
                    ssm_shape: tuple[int, int, int]) -> list[StateRecord]:
    """SDQ_STATE_DUMP's PREFIX.L: one record per micro-batch, in evaluation order: positions
    must follow on from each other from 0. Every header is checked against the layer and
    the model's state shapes."""
    b = _read(path)
    recs: list[StateRecord] = []
    pos, hdr = 0, 4 + 8 * 4
    n_conv, n_ssm = int(np.prod(conv_shape)), int(np.prod(ssm_shape))
    while pos < len(b):
        if len(b) - pos < hdr:
            raise ContractError(path, f"truncated record header at byte {pos}")
        if b[pos:pos + 4] != STATE_DUMP_MAGIC:
            raise ContractError(path, f"bad magic {b[pos:pos + 4]!r} at byte {pos} (expected {STATE_DUMP_MAGIC!r})")
        version, lay, p0, n, c, w, v, ds = struct.unpack_from("<8I", b, pos + 4)
        where = f"record at byte {pos}"
        if version != VERSION:
            raise ContractError(path, f"{where}: version {version}, expected {VERSION}")
        if lay != layer:
            raise ContractError(path, f"{where}: layer {lay}, expected {layer}")
        if (c, w) != tuple(conv_shape) or (v, ds, ds) != tuple(ssm_shape):
            raise ContractError(path, f"{where}: state shapes conv {[c, w]}, ssm {[v, ds, ds]}; the model's are "
                                      f"{list(conv_shape)} and {list(ssm_shape)}")
        want_p0 = recs[-1].position + 1 if recs else 0
        if n == 0 or p0 != want_p0:
            raise ContractError(path, f"{where}: rows {p0}..{p0 + n - 1}, expected a micro-batch from {want_p0}")
        size = 4 * (n_conv + n_ssm)
        if len(b) - pos - hdr < size:
            raise ContractError(path, f"{where}: truncated ({len(b) - pos - hdr} of {size} bytes)")
        a = pos + hdr
        conv = np.frombuffer(b, "<f4", n_conv, a).reshape(conv_shape)
        ssm = np.frombuffer(b, "<f4", n_ssm, a + 4 * n_conv).reshape(ssm_shape)
        recs.append(StateRecord(lay, p0, n, conv, ssm))
        pos = a + size
    if not recs:
        raise ContractError(path, "empty dump (no records)")
    return recs


# ------------------------------------------------------------------------ selftest

@dataclass
class Selftest:
    layer: int
    expert: int
    slot_sha256: bytes
    x: np.ndarray   # (n_rows, n_embd)
    y: np.ndarray   # (n_rows, n_embd)


def read_selftest(path: str | os.PathLike, layer: int | None = None, expert: int | None = None,
                  n_rows: int | None = None, n_embd: int | None = None) -> Selftest:
    b = _read(path)
    hdr = 4 + 5 * 4 + 32
    if len(b) < hdr:
        raise ContractError(path, f"{len(b)} bytes: shorter than the header")
    if b[:4] != SELFTEST_MAGIC:
        raise ContractError(path, f"bad magic {b[:4]!r} (expected {SELFTEST_MAGIC!r})")
    version, lay, exp, n, e = struct.unpack_from("<5I", b, 4)
    if version != VERSION:
        raise ContractError(path, f"version {version}, expected {VERSION}")
    for name, got, want in (("layer", lay, layer), ("expert", exp, expert),
                            ("n_rows", n, n_rows), ("n_embd", e, n_embd)):
        if want is not None and got != want:
            raise ContractError(path, f"{name} {got}, expected {want}")
    size = 2 * 4 * n * e
    if len(b) != hdr + size:
        raise ContractError(path, f"{len(b)} bytes, expected {hdr + size} for {n} rows of {e}")
    if n == 0:
        raise ContractError(path, "no rows")
    sha = b[24:56]
    x = np.frombuffer(b, "<f4", n * e, hdr).reshape(n, e)
    y = np.frombuffer(b, "<f4", n * e, hdr + 4 * n * e).reshape(n, e)
    return Selftest(lay, exp, sha, x, y)


# ------------------------------------------------------------------------ routing profile

def read_profile(path: str | os.PathLike) -> list[tuple[int, int, int]]:
    """--profile-out: `layer expert count` lines (blank lines and # comments ignored), in the
    file's order -> [(layer, expert, count)]."""
    out = []
    for i, line in enumerate(_read(path).decode("utf-8", "replace").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            layer, expert, count = (int(v) for v in line.split())
        except ValueError:
            raise ContractError(path, f"line {i}: expected `layer expert count`, got {line.strip()[:60]!r}") from None
        out.append((layer, expert, count))
    if not out:
        raise ContractError(path, "no routing counts")
    return out


# ------------------------------------------------------------------------ stats

def read_stats(path: str | os.PathLike, fields: tuple[str, ...] = ()) -> list[dict]:
    """One JSON object per line, one per phase (STATS_PHASES: prefill, then decode if there
    was a decode step, each once), each with every one of `fields` (a documented field the
    engine left out is a failure naming it, never a counter quietly not compared); every
    documented field a finite number >= 0, a whole one where it counts something."""
    b = _read(path)
    out = []
    for i, line in enumerate(b.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ContractError(path, f"line {i} is not JSON ({getattr(e, 'msg', 'nested too deep')})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("phase"), str):
            raise ContractError(path, f"line {i} has no phase")
        phase = rec["phase"]
        if phase not in STATS_PHASES:
            raise ContractError(path, f"line {i}: phase {phase[:40]!r} is none of {', '.join(STATS_PHASES)}")
        if any(r["phase"] == phase for r in out):
            raise ContractError(path, f"line {i}: a second {phase} record (one per phase, docs/engine-contract.md, Stats)")
        missing = [f for f in fields if f not in rec]
        if missing:
            raise ContractError(path, f"line {i} ({phase}) lacks the documented field(s) "
                                      f"{', '.join(missing)} (docs/engine-contract.md, Stats)")
        for f in STATS_FIELDS[1:]:
            if f in rec and (problem := _stats_value_problem(f, rec[f])):
                raise ContractError(path, f"line {i} ({phase}): {f} is {problem}")
        out.append(rec)
    if not out:
        raise ContractError(path, "no records")
    phases = [r["phase"] for r in out]
    if phases[0] != "prefill":
        raise ContractError(path, f"no prefill record first (phases: {', '.join(phases)})")
    return out


def _stats_value_problem(field: str, v) -> str | None:
    """Why `v` cannot be the value of the stats field (None: it can)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"{json.dumps(v)[:40]}, not a number"
    if not math.isfinite(v) or v < 0:
        return f"{v}, not a finite number >= 0"
    if field not in STATS_DECIMAL_FIELDS and not float(v).is_integer():
        return f"{v}, not a whole number"
    return None


def counters_of(records: list[dict]) -> dict[str, dict]:
    """{phase: {field: value}} of every exact counter (timings left out): the one
    representation of counters that epmci.compare.counters diffs."""
    return {r["phase"]: {k: v for k, v in r.items() if k != "phase" and k not in STATS_MEASURED_FIELDS}
            for r in records}


def prompt_tokens(stats: list[dict]) -> int:
    """Tokens of the run's prefill phase (0 when it has none)."""
    return int(next((s["tokens"] for s in stats if s["phase"] == "prefill"), 0))


def stats_total(records: list[dict], name: str) -> float:
    """Sum of a counter over phases; ContractError when no phase reports it."""
    vals = [r[name] for r in records if name in r]
    if not vals:
        raise ContractError("stats", f"no phase reports {name!r}")
    return sum(vals)


# ------------------------------------------------------------------------ stderr

def slot_errors(stderr: str) -> list[str]:
    return [l.strip() for l in stderr.splitlines() if l.startswith(SLOT_ERROR_PREFIX)]


def engine_error_line(stderr: str) -> str | None:
    """The engine's one-line `epm-engine: error: ...` (exit 2), if any (last one wins)."""
    lines = [l.strip() for l in stderr.splitlines() if ": error: " in l]
    return lines[-1] if lines else None
