"""Per-step interleaved A/B of two engines: `--perf-base` when both engines take --pace-fds.

Machine noise on a shared runner varies over seconds; whole runs one after another (ABBA,
epmci.perf.abba) see different noise. Here both engines are alive at once and the gate
paces them (docs/engine-contract.md, Pacing): one decode step of one, then one of the other,
in a random order per step pair (balanced over each two step pairs), so what slows the
machine down for a moment hits both sides alike and pairs of steps of the same token (same
routing, same reads) are compared.

1. Probe: each side runs once alone, paced, with the comparison's settings but PROBE_STEPS
   decode steps. It warms numba's cache (a base with other numba sources compiles here),
   proves the engine speaks the protocol (an engine that rejects --pace-fds with exit 2
   while the same run without it works: fall back to ABBA) and measures its peak RSS: both
   engines must fit the available memory at once (epmci.cgroups.available_memory_mib).
   When they do not -- a production-size model on an 8 GB runner -- and the pager lets the
   arena shrink, both sides run at one reduced arena that fits (shared_arena: the probes'
   peak RSS less the arena each reported, the rest split evenly), probed again there; the
   comparison is then of both engines at that same reduced operating point, and the report
   says so. Only when even the minimum arena does not fit: fall back to ABBA.
2. Process pairs: fresh processes started in a random order, the model's page cache dropped
   first, PYTHONHASHSEED fixed; both prefill, then `warmup` + `steps` step pairs. A pair's
   sample is the Hodges-Lehmann estimate of its per-step log tok/s ratios head/base after the
   warm-up steps (wall time; CPU time alike, reported beside it).
3. Decision (epmci.compare.stats.compare_paced) on the pairs' samples after `pairs` pairs and,
   while UNKNOWN, every `step_pairs` more up to `max_pairs`, alpha split over those looks.

The per-step wall times also give each side's inter-token latency percentiles.
"""

from __future__ import annotations

import math
import os
import secrets
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from ..compare.stats import UNKNOWN, Comparison, compare_paced, hodges_lehmann, per_look_alpha
from ..contract.memory import ROOM_SHARE
from ..contract.pace import PacedEngine, PaceError, PaceUnsupported
from ..contract.process import EngineRun, drop_page_cache
from ..contract.runspec import RunSpec
from .abba import Side
from ..cgroups import available_memory_mib
from .machine import CpuContention
from .measure import Measurement, measure, prepare_outdir, read_measurement

# both engines at once need their probes' peak RSS plus this share on top (allocator slack,
# the page cache of the model's resident tensors while they are read, what a longer run
# keeps per token -- logits rows)
MEMORY_MARGIN = 0.15
PROBE_STEPS = 2          # decode steps of a probe: the decode path runs (and compiles), cheaply


class PairFailed(Exception):
    """A paced run failed: which side, why, and its run (stderr tail, command)."""

    def __init__(self, side: str, what: str, reason: str, run: EngineRun | None):
        super().__init__(f"{side} run ({what}): {reason}")
        self.side, self.reason, self.run = side, reason, run


class Unpaceable(Exception):
    """Why this comparison cannot run paced (the caller falls back to ABBA and says so)."""


@dataclass
class ProcessPair:
    started_first: str                  # "base" | "head"
    step_order: str                     # per step pair: A = base stepped first, B = head first
    base_wall: list[float]              # per paired step, warm-up steps included
    head_wall: list[float]
    base_cpu: list[float]
    head_cpu: list[float]
    warmup: int
    base: Measurement                   # counters, fingerprint, peak RSS of each run
    head: Measurement
    other_cpu_pct: float | None = None
    seconds: float = 0.0
    cpus: list[int] | None = None       # the CPUs both engines were pinned to (None: not pinned)

    def log_ratios(self, kind: str = "wall") -> np.ndarray:
        """log(head tok/s / base tok/s) per measured step = log(base time / head time)."""
        b = np.asarray(getattr(self, f"base_{kind}")[self.warmup:])
        h = np.asarray(getattr(self, f"head_{kind}")[self.warmup:])
        return np.log(b / h)

    def sample(self, kind: str = "wall") -> float:
        """The pair's value for the decision: Hodges-Lehmann of its per-step log-ratios."""
        return hodges_lehmann(self.log_ratios(kind))

    def measured(self, side: str) -> list[float]:
        return getattr(self, f"{side}_wall")[self.warmup:]


@dataclass
class PacedResult:
    comparison: Comparison | None = None
    cpu_ratio: float | None = None         # the same estimate on CPU time (exp of the mean pair sample)
    pairs: list[ProcessPair] = field(default_factory=list)
    probes: dict[str, Measurement] = field(default_factory=dict)
    memory: dict = field(default_factory=dict)   # peaks and available MiB behind the two-engine check
    reduced_arena: str = ""                # why both sides ran at memory["arena_mb"] ("": the scenario's arena)
    seed: int = 0
    alpha: float = 0.0                     # per look
    failure: PairFailed | None = None
    seconds: float = 0.0

    @property
    def n_pairs(self) -> int:
        return len(self.pairs)

    def samples(self, kind: str = "wall") -> list[float]:
        return [p.sample(kind) for p in self.pairs]

    def latencies(self, side: str) -> list[float]:
        return [x for p in self.pairs for x in p.measured(side)]

    @property
    def first(self) -> ProcessPair | None:
        return self.pairs[0] if self.pairs else None


def paced_spec(spec: RunSpec, warmup: int, steps: int) -> RunSpec:
    """-n for `warmup` + `steps` decode steps (the last generated token is not fed back)."""
    return replace(spec, n_predict=warmup + steps + 1)


def _engine(side: Side, model, spec: RunSpec, out: Path, timeout: float, label: str,
            cpus: frozenset[int] | None = None) -> PacedEngine:
    try:
        return PacedEngine(side.engine, model, spec, out, timeout=timeout, label=label, env=side.run_env(),
                           cwd=side.cwd or out, cpus=cpus)
    except PaceError as e:
        raise PairFailed(side.label, label, e.reason, e.run) from None


def _measured(side: Side, run: EngineRun, out: Path, label: str, busy: float | None) -> Measurement:
    m = read_measurement(side.engine, label, run, out, other_cpu_pct=busy)
    if not m.ok:
        raise PairFailed(side.label, label, m.failure or "failed", run)
    return m


def probe(side: Side, model, spec: RunSpec, workdir: Path, timeout: float) -> Measurement:
    """The side alone, paced, PROBE_STEPS decode steps of `spec`: raises PaceUnsupported (it
    rejected --pace-fds) or PairFailed; returns the run's measurement (its peak RSS sizes the
    two-engine check)."""
    spec = replace(spec, n_predict=PROBE_STEPS + 1)
    out = prepare_outdir(workdir / f"{side.label}-probe")
    drop_page_cache(model)
    label = f"{side.label} probe"
    with CpuContention() as busy:
        eng = _engine(side, model, spec, out, timeout, label)
        try:
            eng.wait_ready()
            while eng.step() is not None:
                pass
            run = eng.finish()
        except PaceUnsupported:
            raise
        except PaceError as e:
            raise PairFailed(side.label, label, e.reason, e.run) from None
    return _measured(side, run, out, label, busy.other_pct)


def step_orders(rng: np.random.Generator):
    """Which side steps first in each step pair ("base" | "head"): blocks of two step pairs in
    a random one of the orders (base, head), (head, base) or (head, base), (base, head), so
    each side goes first equally often (going first is measurably faster on a busy machine)
    and the order stays random."""
    while True:
        first = "base" if rng.random() < 0.5 else "head"
        second = "head" if first == "base" else "base"
        yield first
        yield second


def pair_cpus(threads: int, rng: np.random.Generator) -> frozenset[int] | None:
    """The CPUs both engines of a pair run on: `threads` of this process's CPUs, picked at
    random per pair; None (no pinning) when that would be all of them."""
    mine = sorted(os.sched_getaffinity(0))
    if threads >= len(mine):
        return None
    return frozenset(int(c) for c in rng.choice(mine, size=threads, replace=False))


def run_pair(head: Side, base: Side, model, spec: RunSpec, workdir: Path, *, warmup: int, timeout: float,
             rng: np.random.Generator, label: str, pin: bool = True) -> ProcessPair:
    """One process pair (step 2 of the module doc). Raises PairFailed; both engines are
    killed whatever goes wrong."""
    sides = {"base": base, "head": head}
    other = {"base": "head", "head": "base"}
    first = "base" if rng.random() < 0.5 else "head"
    cpus = pair_cpus(spec.threads, rng) if pin else None
    # neutral directory names, assigned at random: nothing but the code under test tells the sides apart
    names = ["p", "q"] if rng.random() < 0.5 else ["q", "p"]
    outs = {k: prepare_outdir(workdir / n) for k, n in zip(sides, names)}
    drop_page_cache(model)
    t0 = time.perf_counter()
    engines: dict[str, PacedEngine] = {}
    walls: dict[str, list[float]] = {"base": [], "head": []}
    cpu_s: dict[str, list[float]] = {"base": [], "head": []}
    order = []
    current = first
    try:
        with CpuContention() as busy:
            for k in (first, other[first]):
                current = k
                engines[k] = _engine(sides[k], model, spec, outs[k], timeout, f"{k} {label}", cpus)
            for k in (first, other[first]):
                current = k
                engines[k].wait_ready()
            for pair_first in step_orders(rng):
                if engines["base"].ended and engines["head"].ended:
                    break
                reports = {}
                for k in (pair_first, other[pair_first]):
                    current = k
                    reports[k] = engines[k].step()
                if reports["base"] is not None and reports["head"] is not None:
                    order.append("A" if pair_first == "base" else "B")
                    for k, r in reports.items():
                        walls[k].append(r.wall_s)
                        cpu_s[k].append(r.cpu_s)
            runs = {k: engines[k].finish() for k in ("base", "head")}   # waited for: their CPU is ours
        ms = {k: _measured(sides[k], runs[k], outs[k], f"{k} {label}", busy.other_pct) for k in ("base", "head")}
    except PaceError as e:
        for k, eng in engines.items():
            if k != current:
                eng.kill()
        raise PairFailed(current, label, e.reason, e.run) from None
    except BaseException:
        for eng in engines.values():
            eng.kill()
        raise
    n = len(walls["base"])
    if n <= warmup:
        raise PairFailed("head" if len(engines["head"].steps) <= warmup else "base", label,
                         f"only {n} paired decode steps, {warmup} of them warm-up: nothing measured "
                         f"(an end-of-generation token early? base {len(engines['base'].steps)}, head "
                         f"{len(engines['head'].steps)} steps)", None)
    return ProcessPair(first, "".join(order), walls["base"], walls["head"], cpu_s["base"], cpu_s["head"], warmup,
                       ms["base"], ms["head"], busy.other_pct, time.perf_counter() - t0, sorted(cpus) if cpus else None)


def fits_two(peaks_mib: dict[str, float], available: float | None) -> tuple[bool, str]:
    """Whether both engines fit the memory at once: their probes' peak RSS + MEMORY_MARGIN."""
    need = sum(peaks_mib.values()) * (1.0 + MEMORY_MARGIN)
    have = "unknown" if available is None else f"{available:.0f} MiB"
    what = (f"both engines at once need {need:.0f} MiB (peak RSS base {peaks_mib['base']:.0f} + head "
            f"{peaks_mib['head']:.0f} MiB, +{MEMORY_MARGIN:.0%}), available {have}")
    return (available is None or need <= available), what


def shared_arena(probes: dict[str, Measurement], available: float,
                 min_arena_mb: float) -> tuple[float | None, str]:
    """(the arena in MiB, both engines alike, at which both fit `available` at once; why),
    None when none of at least `min_arena_mb` does. What is not arena in each probe's peak RSS
    (resident weights, KV, buffers, runtime) stays; the rest, less MEMORY_MARGIN, is split
    evenly between the two arenas."""
    rest = {}
    for k, m in probes.items():
        arena = float(m.decode("arena_mb", 0.0) or 0.0)
        if arena <= 0:
            return None, f"the {k} engine reported no arena (its stats' arena_mb) to shrink"
        rest[k] = max(0.0, m.peak_rss_mb - arena)
    # ROOM_SHARE: a little under what the margin leaves, so the probes again at that arena fit
    room = ROOM_SHARE * (available / (1.0 + MEMORY_MARGIN) - sum(rest.values()))
    per_engine = math.floor(max(room, 0.0) / 2 * 1000) / 1000
    what = (f"{available:.0f} MiB available, less {MEMORY_MARGIN:.0%} and what is not arena (base "
            f"{rest['base']:.0f} + head {rest['head']:.0f} MiB), leaves {per_engine:g} MiB of arena per engine")
    if per_engine < min_arena_mb:
        return None, f"{what}, below the minimum arena {min_arena_mb:.1f} MiB"
    return float(per_engine), what


def look_sizes(pairs: int, step_pairs: int, max_pairs: int) -> list[int]:
    """The numbers of process pairs at which a paced decision looks: `pairs`, then every
    `step_pairs` more while UNKNOWN, up to `max_pairs` (per_look_alpha splits alpha over them)."""
    sizes = [pairs]
    while sizes[-1] < max_pairs:
        sizes.append(min(max_pairs, sizes[-1] + max(1, step_pairs)))
    return sizes


def sequential_verdict(samples: list[float], *, pairs: int, step_pairs: int, max_pairs: int, alpha: float,
                       floor: float, min_effect: float) -> tuple[Comparison, int]:
    """The gate's paced decision on pair values taken in order (the first `pairs`, then more at
    each look while UNKNOWN): (the comparison it stops at, pairs used). run_paced makes the
    same looks while it runs the pairs; calibration replays recorded pairs through this."""
    a = per_look_alpha(alpha, pairs, max_pairs, step_pairs)
    for n in look_sizes(pairs, step_pairs, max_pairs):
        if n > len(samples):
            raise ValueError(f"{len(samples)} pair values for a look at {n}")
        c = compare_paced(samples[:n], a, floor, min_effect, 1.0, 1.0)
        if c.verdict != UNKNOWN:
            return c, n
    return c, n


def _probe_both(head: Side, base: Side, model, spec: RunSpec, workdir: Path, timeout: float,
                res: PacedResult) -> None:
    """Probe base and head (step 1 of the module doc) into res.probes; raises Unpaceable when
    one does not take --pace-fds."""
    # the base's features are its tree's, undeclared here: its probe finds out
    for side in (base, head):
        try:
            res.probes[side.label] = probe(side, model, spec, workdir, timeout)
        except PaceUnsupported as e:
            # exit 2 can also be a setting the engine refuses: only when the same run
            # without --pace-fds works was it the flag
            m = measure(side.engine, model, spec, workdir / f"{side.label}-unpaced", timeout=timeout,
                        cwd=side.cwd, env=side.run_env(), label=f"{side.label} probe without --pace-fds")
            if not m.ok:
                raise PairFailed(side.label, "probe without --pace-fds", m.failure or "failed", m.run) from None
            raise Unpaceable(f"the {side.label} engine does not take --pace-fds ({e.reason}; the same "
                             f"run without it works)") from None


def operating_point(head: Side, base: Side, model, spec: RunSpec, workdir: Path, timeout: float,
                    res: PacedResult, *, min_arena_mb: float | None,
                    available: Callable[[], float | None], say: Callable[[str], None]) -> RunSpec:
    """Step 1 of the module doc: probe both sides (into res.probes, res.memory) and return the
    run both engines are compared at -- `spec`, or `spec` at one reduced arena when two do not
    fit at its own (res.reduced_arena says why). Raises Unpaceable when neither fits."""
    _probe_both(head, base, model, spec, workdir, timeout, res)
    have = available()
    ok, what = fits_two({k: m.peak_rss_mb for k, m in res.probes.items()}, have)
    res.memory = {"peak_rss_mb": {k: m.peak_rss_mb for k, m in res.probes.items()}, "available_mb": have, "fits": ok}
    say(f"[perf-base] paced: {what}")
    if ok:
        return spec
    arena, why = (shared_arena(res.probes, have, min_arena_mb) if min_arena_mb is not None
                  and head.engine.has("pager") and spec.pager else (None, "no arena to shrink"))
    if arena is None:
        raise Unpaceable(f"two engines do not fit the memory at once: {what}; nor at a reduced arena: {why}")
    spec = replace(spec, arena_mb=arena)
    _probe_both(head, base, model, spec, workdir / "reduced", timeout, res)
    ok, what2 = fits_two({k: m.peak_rss_mb for k, m in res.probes.items()}, available())
    res.memory.update(arena_mb=arena, reduced_peak_rss_mb={k: m.peak_rss_mb for k, m in res.probes.items()},
                      fits_reduced=ok)
    say(f"[perf-base] paced at a reduced arena of {arena:g} MiB per engine: {what2}")
    if not ok:
        raise Unpaceable(f"two engines do not fit the memory at once: {what}; nor at a reduced arena of "
                         f"{arena:g} MiB per engine: {what2}")
    res.reduced_arena = (f"two engines at the scenario's arena do not fit ({what}); {why}: both sides "
                         f"ran at --arena-mb {arena:g}, the same reduced operating point")
    return spec


def run_paced(head: Side, base: Side, model, spec: RunSpec, workdir: Path, *, pairs: int, max_pairs: int,
              step_pairs: int, warmup: int, alpha: float, floor: float, min_effect: float, timeout: float,
              seed: int | None = None, min_arena_mb: float | None = None,
              available: Callable[[], float | None] | None = None,
              progress: Callable[[str], None] | None = None) -> PacedResult:
    """Steps 1-3 of the module doc. Raises Unpaceable (fall back to ABBA) before any pair ran;
    a failed run is `failure` of the result. `min_arena_mb`: the smallest arena the engines
    take for `spec` (contract.memory.min_arena_mib); None: never run at a reduced arena."""
    say = progress or (lambda s: None)
    res = PacedResult(seed=secrets.randbits(32) if seed is None else seed,
                      alpha=per_look_alpha(alpha, pairs, max_pairs, step_pairs))
    rng = np.random.default_rng(res.seed)
    t0 = time.perf_counter()
    if not head.engine.has("pacing"):
        raise Unpaceable("the head engine does not declare the contract feature pacing (--pace-fds)")
    try:
        spec = operating_point(head, base, model, spec, workdir, timeout, res, min_arena_mb=min_arena_mb,
                               available=available or available_memory_mib, say=say)
        looks = look_sizes(pairs, step_pairs, max_pairs)
        want = looks.pop(0)
        while True:
            k = len(res.pairs) + 1
            pair = run_pair(head, base, model, spec, workdir / f"pair-{k}", warmup=warmup, timeout=timeout,
                            rng=rng, label=f"pair {k}")
            res.pairs.append(pair)
            say(f"[perf-base] pair {k}: head/base tok/s x{math.exp(pair.sample()):.4f} over "
                f"{len(pair.log_ratios())} steps (CPU x{math.exp(pair.sample('cpu')):.4f}), started first: "
                f"{pair.started_first}")
            if len(res.pairs) < want:
                continue
            base_tok_s = 1.0 / statistics.median(res.latencies("base"))
            head_tok_s = 1.0 / statistics.median(res.latencies("head"))
            res.comparison = compare_paced(res.samples(), res.alpha, floor, min_effect, base_tok_s, head_tok_s)
            res.cpu_ratio = math.exp(statistics.fmean(res.samples("cpu")))
            if res.comparison.verdict != UNKNOWN or not looks:
                return res
            want = looks.pop(0)
    except PairFailed as e:
        res.failure = e
        return res
    finally:
        res.seconds = time.perf_counter() - t0
