"""The pacing protocol (docs/engine-contract.md, Pacing), both ends:

- the bundled engine with --pace-fds holds each decode step for a byte, reports it as one JSON
  line, and computes exactly what it computes unpaced (logits, counters, text);
- bad --pace-fds values are one line, exit 2; a channel closed mid-run stops the engine;
- the gate's PacedEngine against broken engine copies (wrapper scripts that monkeypatch the
  bundled engine's pacer): one that never answers, answers garbage, reports a step longer
  than its round trip, or exits mid-run fails closed with the reason and is killed; one that
  rejects the flag with exit 2 is told apart (PaceUnsupported);
- run_paced falls back (Unpaceable) when the head does not declare pacing, an engine does not
  take the flag or two engines do not fit the memory even at the minimum arena, and a failed
  pair is a failure with the side and the reason;
- two engines that do not fit at the scenario's arena run paced at one reduced arena that fits
  (synthetic memory figures: the probes' peak RSS rewritten as a fixed resident part plus the
  arena the engine reported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest

from epmci.contract.capabilities import probe
from epmci.contract.pace import PacedEngine, PaceError, PaceUnsupported
from epmci.contract.process import EngineCommand
from epmci.contract.runspec import RunSpec
from epmci.perf.abba import Side
from epmci.perf.measure import measure
from engine.contract_info import FEATURES
from epmci.config import load_config
from epmci.contract.memory import min_arena_mib
from epmci.gguf.facts import ModelFacts
from epmci.gguf.file import ModelFile
from epmci.perf.measure import Measurement
from epmci.perf.paced import (MEMORY_MARGIN, PairFailed, Unpaceable, fits_two, paced_spec, run_pair, run_paced,
                              shared_arena)

pytestmark = pytest.mark.usefixtures("built_engine")

SPEC = RunSpec("The capital of France is", n_predict=7, batch=4, ctx=64)


def declared(engine: EngineCommand) -> EngineCommand:
    """`engine` with the features its --contract-info declares, as a check has it."""
    caps, why = probe(engine, 60)
    assert caps is not None, why
    return engine.with_features(caps.features)


BUNDLED = EngineCommand.from_setting(None).with_features(FEATURES)      # what its --contract-info says


def engine_copy(tmp_path, patch: str, name: str = "paced_engine.py") -> EngineCommand:
    """The bundled engine with `patch` applied to its modules, as an external engine (its
    --contract-info declares pacing, as the bundled engine's does)."""
    script = tmp_path / name
    script.write_text("import os, sys, time, json\nimport engine.cli\n" + textwrap.dedent(patch)
                      + "\nsys.exit(engine.cli.main())\n")
    return declared(EngineCommand((sys.executable, str(script)), False))


def drive(engine: EngineCommand, model, tmp_path, spec: RunSpec = SPEC, timeout: float = 120.0):
    """Step a paced run to its end; (step reports, run)."""
    eng = PacedEngine(engine, model, spec, tmp_path / "out", timeout=timeout, label="test")
    eng.wait_ready()
    steps = []
    while (r := eng.step()) is not None:
        steps.append(r)
    return steps, eng.finish()


# ------------------------------------------------------------------ the bundled engine

def test_paced_run_reports_every_decode_step_and_computes_the_same_bits(tiny_model, tmp_path):
    steps, run = drive(BUNDLED, tiny_model, tmp_path)
    assert run.ok, run.stderr
    assert [s.step for s in steps] == list(range(1, SPEC.n_predict))      # -n 7: 6 decode steps
    assert all(0 < s.wall_s <= s.rtt_s and s.cpu_s > 0 for s in steps)
    paced_logits = (tmp_path / "out" / "logits.bin").read_bytes()
    paced_stats = [json.loads(l) for l in (tmp_path / "out" / "stats.jsonl").read_text().splitlines()]
    plain = measure(BUNDLED, tiny_model, SPEC, tmp_path / "plain", timeout=120, keep_files=True)
    assert plain.ok, plain.failure
    assert (tmp_path / "plain" / "logits.bin").read_bytes() == paced_logits
    assert plain.run.stdout == run.stdout
    assert {r["phase"]: r for r in paced_stats}["decode"]["tokens"] == SPEC.n_predict - 1
    from epmci.contract.outputs import counters_of
    assert counters_of(paced_stats) == plain.counters


def raw_engine(model, *args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", "-m", str(model), "-p", "Hello", "-n", "4", "-c", "64",
                           *args], capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("value,problem", [("7", "expected R,W"), ("a,b", "expected R,W"), ("3,3", "two different"),
                                           ("250,251", "file descriptor 250 is not open")])
def test_bad_pace_fds_is_one_line_exit_2(tiny_model, value, problem):
    r = raw_engine(tiny_model, "--pace-fds", value)
    assert r.returncode == 2 and problem in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("other", [["--selftest", "0:0:1:{tmp}/s"], ["--tokens-in", "{tmp}/tokens.bin"]],
                         ids=["selftest", "tokens-in"])
def test_pace_fds_without_generated_steps_is_refused(tiny_model, tmp_path, other):
    r = subprocess.run([sys.executable, "-m", "engine", "-m", str(tiny_model), *(a.format(tmp=tmp_path) for a in other),
                        "--pace-fds", "0,1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--selftest and --tokens-in generate none" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_engine_stops_when_the_channel_closes(tiny_model):
    to_engine_r, to_engine_w = os.pipe()
    from_engine_r, from_engine_w = os.pipe()
    p = subprocess.Popen([sys.executable, "-m", "engine", "-m", str(tiny_model), "-p", "Hello", "-n", "6", "-c", "64",
                          "--pace-fds", f"{to_engine_r},{from_engine_w}"], pass_fds=(to_engine_r, from_engine_w),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    os.close(to_engine_r)
    os.close(from_engine_w)
    with os.fdopen(from_engine_r, "rb") as f:
        assert json.loads(f.readline()) == {"event": "ready"}
        os.write(to_engine_w, b"s")
        assert json.loads(f.readline())["step"] == 1
        os.close(to_engine_w)                          # the gate went away before step 2
        _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "closed before decode step 2" in err


# ------------------------------------------------------------------ broken engines fail closed

NEVER_ANSWERS = """
_before = engine.cli.Pacer.before_step
def before_step(self):
    if self.steps == 2:
        time.sleep(3600)
    _before(self)
engine.cli.Pacer.before_step = before_step
"""
GARBAGE = """
def after_step(self):
    self.steps += 1
    os.write(self.w, b"step 1 done in 12 ms\\n")
engine.cli.Pacer.after_step = after_step
"""
WRONG_STEP = """
def after_step(self):
    self.steps += 1
    self._send(event="step", step=7, wall_s=0.01, cpu_s=0.01)
engine.cli.Pacer.after_step = after_step
"""
NO_CPU_TIME = """
def after_step(self):
    self.steps += 1
    self._send(event="step", step=self.steps, wall_s=0.001, cpu_s=0)
engine.cli.Pacer.after_step = after_step
"""
TOO_LONG = """
def after_step(self):
    self.steps += 1
    self._send(event="step", step=self.steps, wall_s=30.0, cpu_s=0.01)
engine.cli.Pacer.after_step = after_step
"""
EXITS_MIDWAY = """
_after = engine.cli.Pacer.after_step
def after_step(self):
    _after(self)
    if self.steps == 3:
        print("simulated crash after step 3", file=sys.stderr, flush=True)
        os._exit(3)
engine.cli.Pacer.after_step = after_step
"""
REJECTS_FLAG = """
if "--pace-fds" in sys.argv:
    print("epm-engine: error: unrecognized arguments: --pace-fds", file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.parametrize("patch,reason", [
    (NEVER_ANSWERS, "no answer at decode step 3 within the run's timeout of 20 s (killed)"),
    (GARBAGE, "answered b'step 1 done in 12 ms' at decode step 1: not a JSON line"),
    (WRONG_STEP, "where the protocol wants a `step` line for step 1"),
    (NO_CPU_TIME, "with wall_s and cpu_s > 0"),
    (TOO_LONG, "reported decode step 1 as 30.000000 s, but it was answered"),
    (EXITS_MIDWAY, "exited at decode step 4: engine crashed (exit 3): simulated crash after step 3"),
], ids=["never-answers", "garbage", "wrong-step", "zero-cpu-time", "longer-than-round-trip", "exits-midway"])
def test_a_broken_paced_engine_fails_closed_and_is_killed(tiny_model, tmp_path, patch, reason):
    eng = PacedEngine(engine_copy(tmp_path, patch), tiny_model, SPEC, tmp_path / "out", timeout=20, label="t")
    with pytest.raises(PaceError) as e:
        eng.wait_ready()
        while eng.step() is not None:
            pass
    assert not isinstance(e.value, PaceUnsupported)
    assert reason in e.value.reason
    assert eng.proc.poll() is not None                   # not left running
    if patch is EXITS_MIDWAY:
        assert "simulated crash" in e.value.run.stderr_tail()


def test_an_engine_that_rejects_the_flag_is_told_apart(tiny_model, tmp_path):
    eng = PacedEngine(engine_copy(tmp_path, REJECTS_FLAG), tiny_model, SPEC, tmp_path / "out", timeout=60, label="t")
    with pytest.raises(PaceUnsupported) as e:
        eng.wait_ready()
    assert "exit 2 before `ready`" in e.value.reason and "unrecognized arguments" in e.value.reason


# ------------------------------------------------------------------ the paced comparison

def paced(head: EngineCommand, model, tmp_path, **kw):
    opts = dict(pairs=3, max_pairs=3, step_pairs=2, warmup=1, alpha=0.01, floor=0.02, min_effect=0.05, timeout=60,
                seed=1)
    opts.update(kw)
    return run_paced(Side("head", head), Side("base", BUNDLED), model, paced_spec(SPEC, 1, 4), tmp_path, **opts)


def test_paced_comparison_of_an_engine_with_itself(tiny_model, tmp_path):
    res = paced(BUNDLED, tiny_model, tmp_path)
    assert res.failure is None and res.comparison is not None
    assert res.n_pairs == 3 and all(len(p.log_ratios()) == 4 for p in res.pairs)
    assert set(res.probes) == {"base", "head"} and res.memory["fits"] is True
    assert all(set(p.step_order) <= {"A", "B"} and len(p.step_order) == 5 for p in res.pairs)
    assert res.first.base.fingerprint() == res.first.head.fingerprint()


def test_engine_without_pacing_falls_back(tiny_model, tmp_path):
    with pytest.raises(Unpaceable, match="the head engine does not take --pace-fds .*the same run without it works"):
        paced(engine_copy(tmp_path, REJECTS_FLAG), tiny_model, tmp_path)


def test_a_head_that_does_not_declare_pacing_falls_back_without_a_run(tiny_model, tmp_path):
    head = BUNDLED.with_features(BUNDLED.features - {"pacing"})
    with pytest.raises(Unpaceable, match="the head engine does not declare the contract feature pacing"):
        paced(head, tiny_model, tmp_path)
    assert not any(tmp_path.iterdir())                       # not even a probe ran


def test_an_engine_that_refuses_the_run_anyway_is_a_failure_not_a_fallback(tiny_model, tmp_path):
    """exit 2 before `ready` that the unpaced run repeats is the engine refusing the setting."""
    refuses = engine_copy(tmp_path, """
if "--contract-info" not in sys.argv:
    print("epm-engine: error: arena too small", file=sys.stderr)
    sys.exit(2)
""")
    res = paced(refuses, tiny_model, tmp_path)
    assert res.failure is not None and res.failure.side == "head" and "arena too small" in res.failure.reason


def test_two_engines_that_do_not_fit_the_memory_fall_back(tiny_model, tmp_path):
    with pytest.raises(Unpaceable, match=r"two engines do not fit the memory at once: both engines at once need \d+"):
        paced(BUNDLED, tiny_model, tmp_path, available=lambda: 10.0)
    ok, what = fits_two({"base": 400.0, "head": 500.0}, 1100.0)
    assert ok and "need 1035 MiB" in what
    assert not fits_two({"base": 400.0, "head": 500.0}, 1000.0)[0]
    assert fits_two({"base": 400.0, "head": 500.0}, None)[0]     # unknown: try (a failed run fails closed)


def probe_figures(peak: float, arena: float) -> Measurement:
    return Measurement("probe", True, stats={"decode": {"arena_mb": arena}}, peak_rss_mb=peak)


def test_shared_arena_splits_what_is_left_after_the_resident_parts():
    """prod35-full on the 8 GB runner: two engines at the scenario's arena (peak RSS 3452 MiB,
    arena 1106 MiB each) do not fit 7600 MiB; at the arena shared_arena picks they do."""
    probes = {k: probe_figures(3452.3, 1105.57) for k in ("base", "head")}
    assert not fits_two({k: 3452.3 for k in probes}, 7600.0)[0]
    arena, what = shared_arena(probes, 7600.0, min_arena_mb=136.0)
    assert arena is not None and 136.0 <= arena < 1105.57, what
    assert fits_two({k: 3452.3 - 1105.57 + arena for k in probes}, 7600.0)[0]
    assert "leaves" in what and "base 2347 + head 2347 MiB" in what
    # the minimum arena does not fit: no arena, and the reason names the minimum
    arena, what = shared_arena(probes, 5500.0, min_arena_mb=136.0)
    assert arena is None and "below the minimum arena 136.0 MiB" in what
    # an engine without an arena to shrink (no pager stats)
    arena, what = shared_arena({"base": probes["base"], "head": probe_figures(3452.3, 0.0)}, 7600.0, 136.0)
    assert arena is None and "the head engine reported no arena" in what


def tiny_min_arena(model, spec: RunSpec) -> float:
    cfg = load_config(None)
    return min_arena_mib(spec, ModelFacts.of(ModelFile(model), cfg.run.slot_align, cfg.run.slot_windows))


def test_two_engines_that_do_not_fit_run_paced_at_one_reduced_arena(tiny_model, tmp_path, synthetic_peaks):
    fake, seen = synthetic_peaks
    spec = replace(SPEC, arena_mb=3.5)
    # both at the scenario's arena need (2 x fake.resident + 2 x 3.5) x margin: give 2 MiB of arena less
    have = (2 * fake.resident + 2 * 3.5 - 2.0) * (1 + MEMORY_MARGIN)
    lowest = tiny_min_arena(tiny_model, spec)
    res = run_paced(Side("head", BUNDLED), Side("base", BUNDLED), tiny_model, paced_spec(spec, 1, 4), tmp_path,
                    pairs=2, max_pairs=2, step_pairs=1, warmup=1, alpha=0.01, floor=0.02, min_effect=0.05,
                    timeout=60, seed=1, min_arena_mb=lowest, available=lambda: have)
    assert res.failure is None and res.comparison is not None, res.failure
    arena = res.memory["arena_mb"]
    assert lowest <= arena < 3.5 and res.memory["fits"] is False and res.memory["fits_reduced"] is True
    assert len(seen) == 4 and all(a <= arena for a in seen[2:])            # probed again at the reduced arena
    assert "same reduced operating point" in res.reduced_arena and f"--arena-mb {arena:g}" in res.reduced_arena
    for p in res.pairs:                                                    # every pair ran at it, both sides
        assert p.base.decode("arena_mb") == p.head.decode("arena_mb") <= arena


@pytest.mark.parametrize("case", ["below minimum", "does not shrink", "no minimum given"])
def test_two_engines_that_do_not_fit_even_reduced_fall_back(tiny_model, tmp_path, synthetic_peaks, case):
    fake, _ = synthetic_peaks
    spec = replace(SPEC, arena_mb=3.5)
    lowest = tiny_min_arena(tiny_model, spec)
    have = (2 * fake.resident + 2 * 3.5 - 2.0) * (1 + MEMORY_MARGIN)
    if case == "below minimum":
        have = (2 * fake.resident + lowest) * (1 + MEMORY_MARGIN)
        why = "nor at a reduced arena: .* below the minimum arena"
    elif case == "does not shrink":       # an engine whose memory does not follow --arena-mb
        fake.shrinks = False
        why = "nor at a reduced arena of [0-9.]+ MiB per engine: both engines at once need"
    else:
        lowest, why = None, "nor at a reduced arena: no arena to shrink"
    with pytest.raises(Unpaceable, match=f"two engines do not fit the memory at once: .*{why}"):
        run_paced(Side("head", BUNDLED), Side("base", BUNDLED), tiny_model, paced_spec(spec, 1, 4), tmp_path,
                  pairs=2, max_pairs=2, step_pairs=1, warmup=1, alpha=0.01, floor=0.02, min_effect=0.05,
                  timeout=60, seed=1, min_arena_mb=lowest, available=lambda: have)
    assert not [d for d in tmp_path.rglob("pair-*")]                       # no pair ran


def test_a_pair_that_fails_midway_names_the_side_and_kills_both(tiny_model, tmp_path):
    head = engine_copy(tmp_path, EXITS_MIDWAY)
    rng = np.random.default_rng(0)
    with pytest.raises(PairFailed) as e:
        run_pair(Side("head", head), Side("base", BUNDLED), tiny_model, paced_spec(SPEC, 1, 4), tmp_path,
                 warmup=1, timeout=60, rng=rng, label="pair 1")
    assert e.value.side == "head" and "exit 3" in e.value.reason
    out = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert out.stdout.strip() == ""                          # no engine of this test left running


def test_step_orders_are_random_and_balanced_per_two_step_pairs():
    from epmci.perf.paced import step_orders
    it = step_orders(np.random.default_rng(3))
    firsts = [next(it) for _ in range(400)]
    blocks = [tuple(firsts[i:i + 2]) for i in range(0, 400, 2)]
    assert set(blocks) == {("base", "head"), ("head", "base")}                   # each side first once per block
    assert 80 < blocks.count(("base", "head")) < 120                              # and the block order is random


def test_both_engines_of_a_pair_share_their_cpus(monkeypatch):
    from epmci.perf import paced
    monkeypatch.setattr(paced.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    rng = np.random.default_rng(0)
    picks = [paced.pair_cpus(1, rng) for _ in range(40)]
    assert all(len(p) == 1 and p <= {0, 1, 2, 3} for p in picks) and len(set(picks)) > 1
    assert len(paced.pair_cpus(2, rng)) == 2
    assert paced.pair_cpus(4, rng) is None and paced.pair_cpus(8, rng) is None    # -t >= CPUs: no pinning


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_pinned_engine_and_all_its_threads_run_on_the_given_cpus(tiny_model, tmp_path):
    cpu = max(os.sched_getaffinity(0))
    eng = PacedEngine(BUNDLED, tiny_model, SPEC, tmp_path / "out", timeout=120, label="t", cpus=frozenset({cpu}))
    try:
        eng.wait_ready()                     # its reader threads exist by now
        pid = eng.proc.proc.pid
        tids = os.listdir(f"/proc/{pid}/task")
        assert len(tids) > 1 and all(os.sched_getaffinity(int(t)) == {cpu} for t in tids)
    finally:
        eng.kill()
