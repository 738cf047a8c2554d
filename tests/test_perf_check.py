"""The perf suite of `epmci check` against golden baselines, on the tiny model, with broken
engine copies (a wrapper script that monkeypatches the bundled engine, then runs
engine.cli.main(), passed with --engine-cmd):

- an engine that reads one extra expert per token fails the counter gate, naming the counter;
- an engine whose logits change in the last bits fails the drift gate with a KL figure;
- a tok/s regression is a failure that says whether I/O moved; a foreign machine, --no-timing
  and a missing baseline are visible skips, never passes;
- `epmci golden update` refuses when a correctness check fails;
- --perf-base builds a git ref in a temporary worktree and measures it ABBA against the head.

One golden baseline (counters and fingerprints) is recorded per test run with
`epmci golden update` and shared by the xdist workers.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import epmci.perf.paced as paced_mod
from epmci.cli import main as epmci_main
from epmci.gguf.identity import model_identity
from epmci.perf.golden import dump_yaml
from faults import ROUTER_NUDGED_IN_LAYER_2

REPO = Path(__file__).resolve().parent.parent
PROFILE = "t"
# cheap settings for the tiny model
SETTINGS = ["--set", "perf.n_predict=8"]


@pytest.fixture(scope="session")
def recorded_golden(built_engine, tiny_model, tmp_path_factory) -> Path:
    """golden/<PROFILE>/ for the tiny model, recorded once per test run (shared by workers)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # xdist: the workers' base temps share a parent that is unique to this run (and
        # cleaned up by pytest like any basetemp)
        root = tmp_path_factory.getbasetemp().parent / "epmci-shared-golden"
    else:
        root = tmp_path_factory.mktemp("golden-shared")
    root.mkdir(parents=True, exist_ok=True)
    gdir = root / "golden"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (gdir / PROFILE).exists():
            rc = epmci_main(["golden", "update", "-q", "--no-build", "--model", str(tiny_model), "--profile", PROFILE,
                             "--reason", "test baseline", "--no-timing", "--set", f"perf.golden_dir={gdir}",
                             "--set", "suites=[determinism]", *SETTINGS])
            assert rc == 0
    return gdir


@pytest.fixture
def golden_dir(recorded_golden, tmp_path) -> Path:
    """A private copy of the shared baseline (tests may edit it)."""
    dst = tmp_path / "golden"
    shutil.copytree(recorded_golden, dst)
    return dst


def golden_file(gdir: Path, model) -> Path:
    return gdir / PROFILE / f"{model_identity(model)['id']}.yaml"


def edit_golden(gdir: Path, model, fn) -> None:
    f = golden_file(gdir, model)
    d = yaml.safe_load(f.read_text())
    fn(d)
    f.write_text(dump_yaml(d))


def wrapper(tmp_path: Path, body: str) -> str:
    p = tmp_path / "engine_wrapper.py"
    p.write_text("import sys\nimport numpy as np\nimport engine.cli\n" + textwrap.dedent(body)
                 + "\nsys.exit(engine.cli.main())\n")
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(p))}"


def check(tmp_path, model, gdir, *args, engine_cmd=None) -> tuple[int, dict, Path]:
    js, junit = tmp_path / "r.json", tmp_path / "junit.xml"
    argv = ["check", "-q", "--no-build", "--model", str(model), "--suites", "perf", "--profile", PROFILE,
            "--set", f"perf.golden_dir={gdir}", *SETTINGS, "--json", str(js), "--junit-xml", str(junit),
            "--workdir", str(tmp_path / "w"), *args]
    if engine_cmd:
        argv += ["--engine-cmd", engine_cmd]
    rc = epmci_main(argv)
    return rc, (json.loads(js.read_text()) if js.exists() else {}), junit


def results(rep: dict) -> dict[str, dict]:
    return {r["name"]: r for s in rep["suites"] if s["name"] == "perf" for r in s["results"]}


def by_suffix(res: dict[str, dict], suffix: str) -> dict:
    (r,) = [v for k, v in res.items() if k.endswith(suffix) or suffix in k]
    return r


# ------------------------------------------------------------------ pass

def test_perf_passes_against_its_own_golden(tmp_path, tiny_model, golden_dir):
    rc, rep, junit = check(tmp_path, tiny_model, golden_dir)
    assert rc == 0, rep
    res = results(rep)
    assert res["baseline: counters"]["status"] == "pass"
    assert "equal golden" in res["baseline: counters"]["message"]
    fps = [r for n, r in res.items() if "fingerprint" in n]
    assert len(fps) == 2 and all(r["status"] == "pass" for r in fps)
    t = res["baseline: decode tok/s vs golden"]
    assert t["status"] == "skip" and "no timing baseline" in t["message"]      # recorded --no-timing
    assert res["baseline: peak RSS"]["status"] == "pass"
    r = res["baseline: routing"]
    assert r["status"] == "pass" and "routing of 2 prompts equals golden on every layer" in r["message"]
    assert r["properties"]["p1_routing_agreement"] == [1.0] * 4          # tiny: 4 layers
    xml = junit.read_text()
    assert 'name="baseline: decode tok/s vs golden.verdict" value="SKIPPED"' in xml
    assert "<skipped" in xml


# ------------------------------------------------------------------ counter gate

def test_extra_expert_read_fails_the_counter_gate(tmp_path, tiny_model, golden_dir):
    cmd = wrapper(tmp_path, """
        # every micro-batch, layer 0 also looks up (and reads on a miss) one expert it was not routed to
        import engine.paging.pager as P
        _fetch = P.Pager.fetch
        def fetch(self, il, experts):
            if il == 0:
                extra = next((e for e in range(self.gm.hp.n_expert - 1, -1, -1) if e not in experts), None)
                if extra is not None:
                    experts = list(experts) + [extra]
            return _fetch(self, il, experts)
        P.Pager.fetch = fetch
    """)
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--no-timing", engine_cmd=cmd)
    assert rc == 1
    res = results(rep)
    c = res["baseline: counters"]
    assert c["status"] == "fail"
    assert "worse than golden" in c["message"] and "decode.misses" in c["message"], c["message"]
    assert any("ssd_bytes" in w for w in c["properties"]["worse"])
    # the outputs are unchanged: the drift gate passes, only the counters catch it
    assert all(r["status"] == "pass" for n, r in res.items() if "fingerprint" in n)


# ------------------------------------------------------------------ drift gate

def test_last_bit_logits_change_fails_the_drift_gate_with_kl(tmp_path, tiny_model, golden_dir):
    cmd = wrapper(tmp_path, """
        # every logit one float32 ulp up: same tokens, same text, different bits
        _w = engine.cli.write_logits
        engine.cli.write_logits = lambda path, logits: _w(path, np.nextafter(np.asarray(logits, np.float32),
                                                                              np.float32(np.inf)))
    """)
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--no-timing", engine_cmd=cmd)
    assert rc == 1
    res = results(rep)
    assert res["baseline: counters"]["status"] == "pass"
    fps = [r for n, r in res.items() if "fingerprint" in n]
    for r in fps:
        assert r["status"] == "fail"
        m = r["message"]
        assert "output drifted from golden" in m and "KL(golden||current) max" in m, m
        assert "generated tokens equal" in m and "top-1 agreement 8/8" in m, m
        assert 0 <= r["properties"]["kl_max"] < 1e-6


# ------------------------------------------------------------------ routing

def test_a_router_moved_in_one_layer_is_named_against_golden(tmp_path, tiny_model, golden_dir):
    """The recorded routing names the layer where a change moved it: layer 2, not before."""
    cmd = wrapper(tmp_path, ROUTER_NUDGED_IN_LAYER_2)
    rc, rep, junit = check(tmp_path, tiny_model, golden_dir, "--no-timing", engine_cmd=cmd)
    assert rc == 1
    r = results(rep)["baseline: routing"]
    assert r["status"] == "fail" and "p1: routing first diverges at layer 2" in r["message"], r["message"]
    p = r["properties"]
    assert p["p1_routing_first_divergent_layer"] == 2 and p["p1_routing_agreement"][:2] == [1.0, 1.0]
    assert p["p1_routing_agreement"][2] < 1.0
    assert 'name="baseline: routing.p1_routing_first_divergent_layer" value="2"' in junit.read_text()


def test_routing_is_skipped_visibly_without_a_dump_or_a_recorded_routing(tmp_path, tiny_model, golden_dir):
    """An engine without the MoE dump, and a golden recorded before routing was: a skip that
    says why (and how to record it), never a pass."""
    from epmci.perf import golden as G
    cmd = wrapper(tmp_path, """
        import engine.contract_info as CI
        CI.FEATURES = tuple(f for f in CI.FEATURES if f != "moe_dump")
    """)
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--no-timing", engine_cmd=cmd)
    r = results(rep)["baseline: routing"]
    assert r["status"] == "skip" and "does not declare moe_dump" in r["message"]
    assert results(rep)["baseline: counters"]["status"] == "pass"   # a wrapper's RSS may differ: not judged here
    f = golden_file(golden_dir, tiny_model)
    g = G.load(f)
    g.routing = {}
    for e in g.scenarios["baseline"]["prompts"]:
        del e["routing_sha256"]
    G.write(g, f)
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--no-timing")
    r = results(rep)["baseline: routing"]
    assert rc == 0 and r["status"] == "skip" and "has no routing for prompt(s) [1, 2]" in r["message"]
    assert "epmci golden update --profile t" in r["message"]


# ------------------------------------------------------------------ timing

def _timing(samples):
    return {"metric": "decode tok/s", "samples": samples, "median": sorted(samples)[len(samples) // 2]}


def test_tok_s_regression_fails_and_says_it_is_not_io(tmp_path, tiny_model, golden_dir):
    # golden says the engine did 100x the tok/s it does: a regression the counters do not explain
    edit_golden(golden_dir, tiny_model, lambda d: d["scenarios"]["baseline"].update(
        timing=_timing([1e5, 1.01e5, 0.99e5, 1.02e5, 0.98e5])))
    rc, rep, junit = check(tmp_path, tiny_model, golden_dir, "--set", "perf.repeats=3")
    assert rc == 1
    t = results(rep)["baseline: decode tok/s vs golden"]
    assert t["status"] == "fail"
    assert "tok/s regressed" in t["message"] and "DIFFERENT" in t["message"]
    assert "not I/O -- compute, or noise" in t["message"]
    assert "golden records no machine speed" in t["message"]
    p = t["properties"]
    # 3 runs vs 5 can at best give p = 2/56, not below 0.05 split over the looks at 3, 5, 7 and 9
    # runs: the UNKNOWN buys two more runs, and 5 vs 5 decides
    assert p["alpha_per_look"] == pytest.approx(0.05 / 4)
    assert p["verdict"] == "DIFFERENT" and p["ratio"] < 0.05 and p["p_value"] < p["alpha_per_look"]
    assert p["n_current"] == 5
    xml = junit.read_text()
    for key in ("baseline", "current", "ratio", "p_value", "verdict"):
        assert f'name="baseline: decode tok/s vs golden.{key}"' in xml, key


@pytest.mark.parametrize("then,explained", [({"cpu_ms": 1e-6, "disk_mib_s": 1e12}, True),
                                             ({"cpu_ms": 1e6, "disk_mib_s": 1e-3}, False)],
                         ids=["machine-was-faster", "machine-was-slower"])
def test_a_drop_the_machine_explains_is_inconclusive_not_a_regression(tmp_path, tiny_model, golden_dir, then,
                                                                       explained):
    """Golden timed 100x today's tok/s. Recorded on a machine whose CPU and disk were far faster
    than this one's now, the drop is the machine's: inconclusive (perf.inconclusive), saying
    so; recorded on a slower machine, it is the engine's: a failure naming the machine too."""
    edit_golden(golden_dir, tiny_model, lambda d: d["scenarios"]["baseline"].update(
        timing={**_timing([1e5, 1.01e5, 0.99e5, 1.02e5, 0.98e5]), "io_wait_share": 0.3, "machine_speed": then}))
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--set", "perf.repeats=3", "--set", "perf.inconclusive=fail")
    t = results(rep)["baseline: decode tok/s vs golden"]
    p = t["properties"]
    assert t["status"] == "fail" and rc == 1                # perf.inconclusive=fail: a visible non-pass either way
    assert p["machine_explains"] is explained and p["machine_speed_then"] == then
    assert p["machine_speed_now"]["cpu_ms"] > 0 and p["machine_speed_now"]["disk_mib_s"] > 0
    assert "with 30 % of decode spent waiting for reads then" in t["message"]
    if explained:
        assert t["message"].startswith("tok/s below golden, but the machine is slower than when golden was timed")
        assert "--perf-base" in t["message"]
    else:
        assert t["message"].startswith("tok/s regressed") and p["machine_factor"] > 1


def test_busy_machine_is_named_in_the_timing_verdict_and_in_golden_show(tmp_path, tiny_model, golden_dir,
                                                                        monkeypatch, capsys):
    """A timing taken while other processes had the CPU measured them too: the verdict says
    so, and a golden recorded that way says so when shown."""
    import epmci.perf.measure as M

    class Busy:
        def __enter__(self):
            self.other_pct = 60.0
            return self

        def __exit__(self, *exc):
            pass
    monkeypatch.setattr(M, "CpuContention", Busy)
    edit_golden(golden_dir, tiny_model, lambda d: (d["scenarios"]["baseline"].update(
        timing=_timing([1e5, 1.01e5, 0.99e5, 1.02e5, 0.98e5])), d["recorded"].update(other_cpu_pct_max=45.5)))
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--set", "perf.repeats=3")
    t = results(rep)["baseline: decode tok/s vs golden"]
    assert rc == 1 and t["status"] == "fail"
    assert "other processes used a median 60% of the CPU" in t["message"]
    assert t["properties"]["other_cpu_pct_median"] == 60.0
    assert t["properties"]["golden_other_cpu_pct_max"] == 45.5
    capsys.readouterr()
    assert epmci_main(["golden", "show", "--model", str(tiny_model), "--profile", PROFILE,
                       "--set", f"perf.golden_dir={golden_dir}"]) == 0
    assert "timed while other processes used at most 46% of the CPU" in capsys.readouterr().out


def test_foreign_machine_skips_timing_but_compares_counters(tmp_path, tiny_model, golden_dir):
    def edit(d):
        d["scenarios"]["baseline"]["timing"] = _timing([1e5, 1e5, 1e5])
        d["machine"]["cpu_model"] = "Some Other CPU"
    edit_golden(golden_dir, tiny_model, edit)
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--set", "perf.repeats=3")
    assert rc == 0                                             # skipped, not failed
    res = results(rep)
    t = res["baseline: decode tok/s vs golden"]
    assert t["status"] == "skip" and "does not match profile 't'" in t["message"]
    assert "cpu_model: 'Some Other CPU' != " in t["message"]
    assert res["baseline: counters"]["status"] == "pass"


def test_fast_skips_timing_against_golden_but_compares_counters(tmp_path, tiny_model, golden_dir):
    edit_golden(golden_dir, tiny_model, lambda d: d["scenarios"]["baseline"].update(timing=_timing([1e5] * 5)))
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--fast")
    assert rc == 0                                             # a 100x "regression", not judged
    res = results(rep)
    t = res["baseline: decode tok/s vs golden"]
    assert t["status"] == "skip" and "--fast" in t["message"]
    assert res["baseline: counters"]["status"] == "pass"


def test_no_timing_is_reported_as_skipped(tmp_path, tiny_model, golden_dir):
    edit_golden(golden_dir, tiny_model, lambda d: d["scenarios"]["baseline"].update(timing=_timing([1e5] * 3)))
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--no-timing")
    assert rc == 0
    t = results(rep)["baseline: decode tok/s vs golden"]
    assert t["status"] == "skip" and "--no-timing" in t["message"]


# ------------------------------------------------------------------ missing baseline

def test_missing_baseline_is_a_visible_skip(tmp_path, tiny_model, built_engine):
    rc, rep, junit = check(tmp_path, tiny_model, tmp_path / "empty-golden", "--profile", "nosuch", "--no-timing")
    assert rc == 0
    res = results(rep)
    for name in ("baseline: counters", "baseline: decode tok/s vs golden"):
        assert res[name]["status"] == "skip"
    msg = res["baseline: counters"]["message"]
    assert "no golden baseline for profile 'nosuch'" in msg
    assert "epmci golden update --profile nosuch --reason" in msg
    assert all(r["status"] == "skip" for n, r in res.items() if "fingerprint" in n)
    assert res["baseline: peak RSS"]["status"] == "pass"
    assert junit.read_text().count("<skipped") >= 4


@pytest.mark.parametrize("env, flag, status", [
    ({"CI": "true"}, [], "fail"), ({"GITHUB_ACTIONS": "true"}, [], "fail"),
    ({"CI": "true"}, ["--allow-missing-baseline"], "skip"), ({}, ["--set", "perf.missing_baseline=fail"], "fail"),
    ({"CI": "false"}, [], "skip"),
])
def test_missing_baseline_fails_in_ci(tmp_path, tiny_model, built_engine, monkeypatch, capsys, env, flag, status):
    """Nothing to compare with is not a pass where the gate decides (CI): a pull request that
    changes the model identity must not switch the drift gate off unnoticed."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, rep, _ = check(tmp_path, tiny_model, tmp_path / "empty-golden", "--profile", "nosuch", "--no-timing", *flag)
    res = results(rep)
    assert rc == (1 if status == "fail" else 0)
    assert res["baseline: counters"]["status"] == status
    assert all(r["status"] == status for n, r in res.items() if "fingerprint" in n)
    msg = res["baseline: counters"]["message"]
    assert "epmci golden update --profile nosuch" in msg
    assert ("--allow-missing-baseline makes it a skip" in msg) == (status == "fail")
    # the console says at the top, before the table, what was not compared
    out = capsys.readouterr().out
    head = out.split("SUITE", 1)[0]
    if status == "skip":
        assert "check(s) skipped, not compared:" in head and "no golden baseline for profile 'nosuch'" in head


# ------------------------------------------------------------------ memory gate

def test_memory_growth_under_the_budget_fails_against_golden(tmp_path, tiny_model, golden_dir):
    """64 MiB more, far under the 1024 MiB budget: the golden comparison catches it."""
    cmd = wrapper(tmp_path, """
        import engine.runtime as R
        good = R.Engine.__init__
        def __init__(self, *a, **k):
            good(self, *a, **k)
            self.ballast = np.ones(64 << 18, dtype=np.float32)       # 64 MiB, touched
        R.Engine.__init__ = __init__
    """)
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--no-timing", engine_cmd=cmd)
    r = results(rep)["baseline: peak RSS"]
    assert rc == 1 and r["status"] == "fail", r
    assert "grew past golden" in r["message"] and r["properties"]["peak_rss_mb"] > r["properties"]["rss_limit_mb"]
    assert r["properties"]["peak_rss_mb"] < r["properties"]["budget_mb"]
    assert results(rep)["baseline: counters"]["status"] == "pass"       # nothing else changed


def test_memory_within_the_allowed_growth_passes(tmp_path, tiny_model, golden_dir):
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--no-timing", "--set", "perf.rss_growth_mb=0",
                       "--set", "perf.rss_growth_pct=50")
    r = results(rep)["baseline: peak RSS"]
    assert rc == 0 and r["status"] == "pass" and r["properties"]["rss_limit_mb"] > r["properties"]["golden_peak_rss_mb"]


# ------------------------------------------------------------------ golden update

def test_golden_update_with_timing_on_a_busy_machine_warns_and_records_it(tmp_path, tiny_model, built_engine,
                                                                          monkeypatch, capsys):
    import epmci.perf.measure as M
    # measure() calls in order: prompt 2 (not timed), prompt 1 (the first timed sample),
    # timed runs 2 and 3
    shares = iter([50.0, 5.0, 35.0, 12.0])

    class Busy:
        def __enter__(self):
            self.other_pct = next(shares, 0.0)
            return self

        def __exit__(self, *exc):
            pass
    monkeypatch.setattr(M, "CpuContention", Busy)
    gdir = tmp_path / "golden"
    rc = epmci_main(["golden", "update", "--no-build", "--model", str(tiny_model), "--profile", PROFILE,
                     "--reason", "busy", "--repeat", "3", "--set", f"perf.golden_dir={gdir}",
                     "--set", "suites=[determinism]", *SETTINGS])
    out = capsys.readouterr()
    assert rc == 0, out.err
    said = (out.out + out.err).splitlines()
    lines = {n: next(l for l in said if f"timed run {n}/3" in l) for n in (2, 3)}
    assert "WARNING: other processes used 35% of the CPU" in lines[2] and "WARNING" not in lines[3]
    d = yaml.safe_load(golden_file(gdir, tiny_model).read_text())
    assert d["recorded"]["timing"] is True
    assert d["recorded"]["other_cpu_pct_max"] == 35.0      # the untimed prompt-2 run's 50 % is not a sample
    assert "timed while other processes used at most 35% of the CPU" in out.out
    t = d["scenarios"]["baseline"]["timing"]                # the machine's speed beside the samples
    assert t["machine_speed"]["cpu_ms"] > 0 and t["machine_speed"]["disk_mib_s"] > 0
    assert 0 <= t["io_wait_share"] <= 1
    assert "machine then: CPU workload" in out.out



def test_golden_update_refuses_when_a_correctness_check_fails(tmp_path, tiny_model, built_engine, capsys):
    cmd = wrapper(tmp_path, """
        import engine.kernels as K
        good = K.matmul_rows
        K.matmul_rows = lambda ws, qtype, a, rows_of: (good(ws, qtype, a, rows_of)
                                                       * np.float32(1.002 if qtype == K.Q6_K else 1.0))
    """)
    gdir = tmp_path / "golden"
    rc = epmci_main(["golden", "update", "-q", "--no-build", "--model", str(tiny_model), "--profile", PROFILE,
                     "--reason", "should not be written", "--engine-cmd", cmd, "--set", f"perf.golden_dir={gdir}",
                     "--set", "suites=[kernel]", "--set", "kernel.pairs=[[1, 7]]", "--set", "kernel.paths=[]"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "refusing to record baselines: 1 correctness check(s) failed" in err
    assert "kernel / L1 E7" in err
    assert "expert output differs from the reference" in err   # the wrong product, not a crash
    assert not gdir.exists()


def test_recorded_golden_has_the_reason_and_no_timing(recorded_golden, tiny_model, capsys):
    assert epmci_main(["golden", "show", "--model", str(tiny_model), "--profile", PROFILE,
                       "--set", f"perf.golden_dir={recorded_golden}"]) == 0
    out = capsys.readouterr().out
    assert "test baseline" in out and "no timing" in out and "first tokens" in out


# ------------------------------------------------------------------ --perf-base

def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), "-c", "user.name=epmci-test", "-c", "user.email=t@example.com",
                        "-c", "commit.gpgsign=false", *args], capture_output=True, text=True, check=True)
    return r.stdout.strip()


def slow_base_repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose commit has an engine that sleeps 20 ms per decoded token."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "engine", repo / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    rt = repo / "engine" / "runtime.py"
    src = rt.read_text()
    needle = "        t0 = time.perf_counter()\n"          # Engine.eval: inside the timed phase
    assert needle in src
    rt.write_text(src.replace(needle, needle + "        if phase == \"decode\":\n            time.sleep(0.02)\n", 1))
    (repo / "epmci.yaml").write_text("model: tiny\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "slow base")
    return repo, _git(repo, "rev-parse", "HEAD")


def perf_base_check(tmp_path, model, repo: Path, sha: str, *args: str) -> tuple[int, dict[str, dict]]:
    js = tmp_path / "r.json"
    rc = epmci_main(["check", "-q", "--no-build", "--config", str(repo / "epmci.yaml"), "--model", str(model),
                     "--suites", "perf", "--perf-base", sha, "--set", "perf.prompts=[Hello]", *SETTINGS,
                     "--set", "perf.base_steps=8", "--set", "perf.base_warmup_steps=2",
                     "--set", "perf.abba_n_predict=16", "--json", str(js), "--workdir", str(tmp_path / "w"), *args])
    return rc, results(json.loads(js.read_text()))


def head_beats_slow_base(tmp_path, model, *args: str) -> tuple[str, dict[str, dict], dict]:
    """--perf-base against slow_base_repo's commit: the check passes and the head is
    DIFFERENT, over 1.3x faster. (base sha, all results, the tok/s result)."""
    repo, sha = slow_base_repo(tmp_path)
    rc, res = perf_base_check(tmp_path, model, repo, sha, *args)
    b = res[f"baseline: decode tok/s vs base {sha}"]
    assert rc == 0, b
    p = b["properties"]
    assert b["status"] == "pass" and p["verdict"] == "DIFFERENT" and p["ratio"] > 1.3, b["message"]
    return sha, res, b


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_perf_base_paces_a_git_ref_in_a_worktree(tmp_path, tiny_model, built_engine):
    """--perf-base runs the slow commit's engine (from a temporary worktree) alive beside the
    bundled one, their decode steps interleaved: the head is faster, and its latencies too."""
    sha, res, b = head_beats_slow_base(tmp_path, tiny_model)
    p = b["properties"]
    assert p["mode"] == "paced" and p["pairs"] == 6 and len(p["pair_ratios"]) == 6 and p["base_sha"] == sha
    assert all(r > 1.3 for r in p["pair_ratios"]) and p["cpu_ratio"] > 0
    assert "reused" in p["base_build"]                        # numba sources identical: no recompile
    assert p["outputs_equal_base"] is True and p["memory"]["fits"] is True
    assert f"at {sha[:12]}" in b["message"] and "6 process pairs x 8 interleaved decode steps" in b["message"]
    lat = res[f"baseline: p99 inter-token latency vs base {sha}"]
    lp = lat["properties"]
    # the base sleeps 20 ms a step; the median shows it, a p99 of 48 steps is one step and may
    # be the head's at a load spike (CI ran it at 1.36 beside the parallel suite)
    assert lat["status"] == "pass" and lp["head_p50_ms"] < lp["base_p50_ms"] and lp["base_p50_ms"] > 20
    assert lp["steps_per_side"] == 48 and lp["p99_ratio"] > 0
    assert "p50/p95/p99" in lat["message"]
    assert _git(tmp_path / "repo", "worktree", "list").count("\n") == 0       # the worktree is gone
    assert res["baseline: counters"]["status"] == "skip"        # no golden for this profile: visible skips


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_perf_base_paces_two_engines_that_only_fit_at_a_reduced_arena(tmp_path, tiny_model, built_engine,
                                                                      synthetic_peaks, monkeypatch):
    """The production-size case on synthetic memory figures: two engines at the scenario's
    arena do not fit, at a smaller arena they do -- the comparison stays paced (and still sees
    the slow base), both sides at that arena, and the verdict says so."""
    fake, seen = synthetic_peaks
    # both at the arena the probes first reported need 1 MiB more than there is
    monkeypatch.setattr(paced_mod, "available_memory_mib",
                        lambda: (2 * fake.resident + 2 * seen[0] - 1.0) * (1 + paced_mod.MEMORY_MARGIN))
    sha, res, b = head_beats_slow_base(tmp_path, tiny_model, "--set", "perf.arena_fraction=1.0")
    p = b["properties"]
    assert p["mode"] == "paced", b["message"]
    m = p["memory"]
    assert m["fits"] is False and m["fits_reduced"] is True and m["arena_mb"] < seen[0]
    assert "same reduced operating point" in p["reduced_arena"] and p["reduced_arena"] in b["message"]
    assert f"--arena-mb {m['arena_mb']:g}" in b["message"]


@pytest.mark.long
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_perf_base_abba_mode_measures_whole_runs(tmp_path, tiny_model, built_engine):
    sha, res, b = head_beats_slow_base(tmp_path, tiny_model, "--set", "perf.base_mode=abba")
    p = b["properties"]
    assert p["mode"] == "abba" and p["fallback"] == "perf.base_mode is abba"
    assert p["pairs"] == 8 and p["order"] == "AB" + "BAAB" * 3 + "BA"
    assert p["n_predict"] == 16 and p["test"] == "wilcoxon" and "Wilcoxon signed-rank" in b["message"]
    lat = res[f"baseline: p99 inter-token latency vs base {sha}"]
    assert lat["status"] == "skip" and "no per-step times" in lat["message"]


REJECTS_PACING = """
if "--pace-fds" in sys.argv:
    print("epm-engine: error: unrecognized arguments: --pace-fds", file=sys.stderr)
    sys.exit(2)
"""
HUGE_RSS = """
import engine.runtime
_records = engine.runtime.Engine.stats_records
engine.runtime.Engine.stats_records = lambda self: [{**r, "peak_rss_mb": 1e8} for r in _records(self)]
"""


@pytest.mark.long
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("patch,why", [(REJECTS_PACING, "the base engine does not take --pace-fds"),
                                       (HUGE_RSS, "two engines do not fit the memory at once")],
                         ids=["no-pacing", "no-memory"])
def test_perf_base_falls_back_to_abba_and_says_why(tmp_path, tiny_model, built_engine, patch, why):
    """An external engine without --pace-fds, or two engines whose peak RSS does not fit the
    machine's memory: whole-run ABBA, and the verdict says so."""
    repo, sha = slow_base_repo(tmp_path)
    rc, res = perf_base_check(tmp_path, tiny_model, repo, sha, "--engine-cmd", wrapper(tmp_path, patch))
    b = res[f"baseline: decode tok/s vs base {sha}"]
    p = b["properties"]
    assert p["mode"] == "abba" and why in p["fallback"] and why in b["message"] and "ABBA" in b["message"], b
    assert p["verdict"] in ("SAME", "DIFFERENT", "UNKNOWN") and p["pairs"] >= 8    # both sides ran whole runs
    lat = res[f"baseline: p99 inter-token latency vs base {sha}"]
    assert lat["status"] == "skip" and why in lat["message"]


def test_perf_base_unknown_ref_is_exit_2(tmp_path, tiny_model, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "epmci.yaml").write_text("model: tiny\n")
    _git(repo, "init", "-q")
    rc = epmci_main(["check", "-q", "--no-build", "--config", str(repo / "epmci.yaml"), "--model", str(tiny_model),
                     "--suites", "perf", "--perf-base", "no-such-ref", "--workdir", str(tmp_path / "w")])
    assert rc == 2
    assert "'no-such-ref' is not a commit" in capsys.readouterr().err
    assert epmci_main(["check", "-q", "--no-build", "--suites", "kernel", "--perf-base", "HEAD"]) == 2


# ------------------------------------------------------------------ whose baselines

OTHER_ENGINE = """
    import engine.contract_info as CI
    CI.NAME = "other-engine"
"""


@pytest.mark.parametrize("env, status", [({}, "skip"), ({"CI": "true"}, "fail")])
def test_another_engines_runs_are_not_compared_with_golden(tmp_path, tiny_model, golden_dir, monkeypatch, env,
                                                           status):
    """Golden records whose baselines they are: an engine of another name is refused with one
    line naming both (a skip, or in CI a failure as for no baseline), never 'worse than golden'."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, rep, _ = check(tmp_path, tiny_model, golden_dir, "--engine-cmd", wrapper(tmp_path, OTHER_ENGINE))
    res = results(rep)
    assert rc == (1 if status == "fail" else 0), rep
    for name, st in (("baseline: counters", status), ("baseline: decode tok/s vs golden", "skip")):
        msg = res[name]["message"]
        assert res[name]["status"] == st and "worse than golden" not in msg
        assert "holds the baselines of engine 'epm-engine', this check runs 'other-engine'" in msg, msg
    assert all(r["status"] == status for n, r in res.items() if "fingerprint" in n)
    assert "golden_peak_rss_mb" not in res["baseline: peak RSS"]["properties"]


def test_golden_update_does_not_replace_another_engines_baselines(tmp_path, tiny_model, golden_dir, capsys):
    before = golden_file(golden_dir, tiny_model).read_bytes()
    assert yaml.safe_load(before)["engine"]["name"] == "epm-engine"
    rc = epmci_main(["golden", "update", "-q", "--no-build", "--model", str(tiny_model), "--profile", PROFILE,
                     "--reason", "another engine", "--no-timing", "--engine-cmd", wrapper(tmp_path, OTHER_ENGINE),
                     "--set", f"perf.golden_dir={golden_dir}", "--set", "suites=[determinism]", *SETTINGS])
    err = capsys.readouterr().err
    assert rc == 1 and "holds the baselines of engine 'epm-engine'" in err and "another --profile" in err
    assert golden_file(golden_dir, tiny_model).read_bytes() == before
