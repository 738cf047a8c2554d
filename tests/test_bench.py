"""`epmci bench` and the measurement under it: experiments as data, page cache dropped and RAM
budget passed on every run, KPIs and fingerprints read from the engine's files, outputs
that differ from the baseline row flagged, JSON + Markdown with deltas."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from epmci.cli import main as epmci_main
from epmci.compare.counters import counter_changes, io_diagnosis
from epmci.compare.logits import drift
from epmci.config import experiments as X
from epmci.contract.process import EngineCommand
from epmci.contract.runspec import RunSpec
from epmci.gguf.facts import ModelFacts
from epmci.perf import bench as B
from epmci.perf import measure as M
from epmci.errors import InputError

# A stand-in engine speaking docs/engine-contract.md: 3 prompt tokens, n generated, logits
# whose argmax is token 7 + position; SDQ_FAKE_MISSES changes a counter, SDQ_FAKE_BUMP the logits.
FAKE_ENGINE = r'''
import json, os, struct, sys
import numpy as np
from epmci.contract.outputs import BRANCH_EVENTS
a = sys.argv[1:]
def opt(name, default=None):
    return a[a.index(name) + 1] if name in a else default
n = int(opt("-n")); V = 32; P = 3
rows = np.zeros((P + n - 1, V), np.float32)
for r in range(rows.shape[0]):
    rows[r, (7 + r) % V] = 5.0
rows += np.float32(os.environ.get("SDQ_FAKE_BUMP", "0"))
with open(opt("--logits-out"), "wb") as f:
    f.write(struct.pack("<i", V) + rows.tobytes())
misses = int(os.environ.get("SDQ_FAKE_MISSES", "5"))
with open(opt("--stats-file"), "a") as f:
    for phase, toks in (("prefill", P), ("decode", n - 1)):
        f.write(json.dumps({"phase": phase, "tokens": toks, "seconds": 0.5, "tok_s": toks / 0.5,
                            "hit_rate": 50.0, "hits": 5, "misses": misses, "evictions": 1, "ssd_bytes": 1000,
                            "ssd_bytes_per_token": 1000 / toks, "io_bytes": 1000, "n_slots": 4,
                            "n_slots_small": 3, "n_slots_large": 1, "prefetch_issued": 2,
                            "prefetch_used": 1, "prefetch_used_rate": 50.0, "io_wait_s": 0.01,
                            "io_direct_pct": 100.0, "arena_mb": 1.0, "ram_need_mb": 90.0,
                            **dict.fromkeys(BRANCH_EVENTS, 0), "peak_rss_mb": 99.0, "vm_swap_mb": 0.0}) + "\n")
with open(os.environ["FAKE_ARGV_LOG"], "a") as f:
    f.write(json.dumps(a) + "\n")
print("text")
'''


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE_ENGINE)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("FAKE_ARGV_LOG", str(log))
    return EngineCommand((sys.executable, str(script)), False), log


def test_matrices_are_data():
    assert set(X.MATRICES) == {"quick", "io", "cache", "slot", "arena", "pf"}
    for names in X.MATRICES.values():
        assert names[0] == "baseline" and all(n in X.EXPERIMENTS for n in names)
    every = [e.name for e in X.select("all")]
    assert len(every) == len(set(every)) and every.count("baseline") == 1
    assert [e.name for e in X.select("io", "io-threads=2,parallel")] == ["io-threads=2", "io-parallel=off"]
    with pytest.raises(InputError):
        X.select("nosuch")
    with pytest.raises(InputError):
        X.select("slot", "zzz")


def test_experiment_spec_overrides_and_minimum_arena():
    fixed = dict(X.FIXED)
    # 100 experts of 1 MiB (100 MiB); one slot class of 1.25 MiB, top-2: -b 8 needs 16 slots = 20 MiB
    mib = 1 << 20
    facts = ModelFacts(1, 100, 2, 256, [("Q4_K", "Q4_K", "Q5_K")], [mib], [mib + mib // 4])
    s = X.EXPERIMENTS["prefetch=off"].spec("p", fixed, facts)
    assert s.arena_mb == pytest.approx(25.0) and not s.prefetch and s.ram_budget_mb == 1024.0
    s = X.EXPERIMENTS["arena=15%"].spec("p", fixed, facts)
    assert s.arena_mb == pytest.approx(20.0, abs=2e-6)        # raised to the engine's minimum
    assert int(s.arena_mb * mib) >= 20 * mib
    s = X.EXPERIMENTS["hot-pin=64"].spec("p", fixed, facts, routing_profile="/x/routing")
    assert s.env == {"SDQ_HOT_PIN": "64", "SDQ_PROFILE_IN": "/x/routing"}
    assert X.EXPERIMENTS["hot-pin=64"].needs_routing_profile
    args = s.args("/m.gguf", Path("/o"))
    assert args[args.index("--ram-budget-mb") + 1] == "1024"
    assert "--dump-logits" in args and "--stats-file" in args and "--temp" in args


def test_measure_reads_kpis_and_fingerprint(fake_engine, tmp_path, monkeypatch):
    engine, log = fake_engine
    dropped = []
    monkeypatch.setattr(M, "drop_page_cache", lambda p: dropped.append(str(p)))
    spec = RunSpec("hello", n_predict=4, arena_mb=2.0, ram_budget_mb=512)
    m = M.measure(engine, tmp_path / "model.gguf", spec, tmp_path / "out", timeout=60, keep_rows=2)
    assert m.ok, m.failure
    assert dropped == [str(tmp_path / "model.gguf")]            # page cache dropped before the run
    argv = json.loads(log.read_text().splitlines()[0])
    assert argv[argv.index("--ram-budget-mb") + 1] == "512"
    assert m.prompt_tokens == 3 and m.first_tokens == [9, 10, 11, 12]   # argmax from row P-1 on
    assert m.logits_rows == 6 and len(m.logits_sha256) == 64 and m.gen_rows.shape == (2, 32)
    assert m.tok_s == 6.0 and m.peak_rss_mb == 99.0
    assert m.counters["decode"]["misses"] == 5 and "tok_s" not in m.counters["decode"]
    # the stats file is appended to by the engine: a second run must not see the first's records
    m2 = M.measure(engine, tmp_path / "model.gguf", spec, tmp_path / "out", timeout=60)
    assert m2.counters == m.counters and m2.logits_sha256 == m.logits_sha256


def test_measure_failure_is_data(tmp_path):
    engine = EngineCommand((sys.executable, "-c", "import sys; print('epm-engine: error: x: bad', file=sys.stderr); sys.exit(2)"), False)
    m = M.measure(engine, tmp_path / "m.gguf", RunSpec("p"), tmp_path / "o", timeout=30, drop_cache=False)
    assert not m.ok and "exit 2" in m.failure and "bad" in m.failure


def test_counter_changes_and_io_diagnosis():
    g = {"decode": {"tokens": 15, "hits": 90, "misses": 30, "ssd_bytes_per_token": 100.0, "n_slots": 8}}
    c = {"decode": {"tokens": 15, "hits": 88, "misses": 32, "ssd_bytes_per_token": 110.0, "n_slots": 9}}
    kinds = {ch.key: ch.kind for ch in counter_changes(g, c)}
    assert kinds == {"decode.hits": "worse", "decode.misses": "worse", "decode.ssd_bytes_per_token": "worse",
                     "decode.n_slots": "changed"}
    kinds = {ch.key: ch.kind for ch in counter_changes(c, g)}
    assert kinds["decode.misses"] == "better" and kinds["decode.n_slots"] == "changed"
    io, text = io_diagnosis(g["decode"], c["decode"])
    assert io and "I/O regression" in text and "+10.0%" in text
    io, text = io_diagnosis(g["decode"], dict(g["decode"]))
    assert not io and "compute, or noise" in text


def test_drift_measures_kl_and_top1():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 50)).astype(np.float32)
    d = drift(a, a.copy())
    assert d.max_kl == 0 and d.argmax_agree == 4 and d.first_row_differ is None
    b = np.nextafter(a, np.float32(np.inf))
    d = drift(a, b)
    assert 0 <= d.max_kl < 1e-10 and d.argmax_agree == 4 and d.first_row_differ == 0
    c = a.copy()
    c[2] = -c[2]
    d = drift(a, c)
    assert d.max_kl > 0.1 and d.argmax_agree < 4 and "KL(golden||current)" in d.drift_text()
    assert drift(a[:0], a).drift_text() == "no logits rows to compare"


def test_markdown_deltas_and_flags():
    base = {"name": "baseline", "tok_s": 10.0, "hit_rate": 60.0, "ssd_mib_per_token": 7.0, "peak_rss_mb": 200,
            "vm_swap_mb": 0, "n_slots": 127, "slots_small_large": "95/32", "evictions": 400,
            "prefetch_used_rate": 70.0, "stable": True, "outputs_match_baseline": None}
    other = dict(base, name="prefetch=off", tok_s=12.0, hit_rate=25.0, evictions=300, outputs_match_baseline=False,
                 read_mib_per_token=7.35, other_cpu_pct_max=48.0)
    broken = {"name": "admit=2", "error": "engine crashed (exit 1): boom"}
    md = B.to_markdown({"results": [base, other, broken], "baseline": "baseline", "fixed": X.FIXED,
                        "prompts": ["a", "b"], "repeat": 3})
    lines = md.splitlines()
    row = next(l for l in lines if l.startswith("| prefetch=off"))
    assert "12.00 (+20.0%)" in row and "25.0% (-35)" in row and "300 (-25.0%)" in row
    assert "differ from baseline" in row
    # what the reads moved beside the experts' bytes, and a busy machine named
    assert "7.000 (7.350)" in row and "up to 48%" in row
    assert any(l.startswith("| admit=2 | ❌ engine crashed") for l in lines)
    assert lines[0].startswith("| experiment | decode tok/s | hit rate | SSD MiB/token (read) | peak RSS")
    assert all(l.count("|") == lines[0].count("|") for l in lines if l.startswith("| "))


def test_bench_cli_on_the_tiny_model_flags_changed_outputs(tmp_path, tiny_model, capsys):
    """A real bench (slot suite: baseline + uniform slots) with an engine copy whose logits change
    only with uniform slots: that row is flagged, the command exits 1; JSON and Markdown written."""
    script = tmp_path / "engine_wrapper.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import numpy as np
        import engine.cli as C
        if os.environ.get("SDQ_FORCE_UNIFORM_SLOT") == "1":
            _w = C.write_logits
            C.write_logits = lambda path, logits: _w(path, np.nextafter(np.asarray(logits, np.float32), np.float32(np.inf)))
        sys.exit(C.main())
    """))
    out = tmp_path / "results"
    rc = epmci_main(["bench", "--model", str(tiny_model), "--suite", "slot", "--repeat", "1", "--n-predict", "4",
                     "--out", str(out), "--engine-cmd", f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"])
    text = capsys.readouterr().out
    assert rc == 1, text
    assert "[bench 1/4] baseline  prompt 1/2 run 1/1:" in text and "tok/s decode" in text
    assert "OUTPUTS DIFFER FROM BASELINE" in text and "flagged" in text
    data = json.loads((out / "bench_slot.json").read_text())
    rows = {r["name"]: r for r in data["results"]}
    assert set(rows) == {"baseline", "uniform-slots"}
    assert rows["uniform-slots"]["outputs_match_baseline"] is False
    for r in rows.values():
        assert r["tok_s"] > 0 and r["peak_rss_mb"] > 0 and len(r["fingerprints"]) == 2
        assert all(len(f["first_tokens"]) == 4 for f in r["fingerprints"])
    # uniform slots change the arena layout (and so the counters), not the outputs of a correct engine
    assert rows["uniform-slots"]["slots_small_large"].startswith("0/")
    md = (out / "bench_slot.md").read_text()
    assert "| uniform-slots |" in md and "differ from baseline" in md
