"""Each layer of `epmci check` catches what it exists for: the check is run against
deliberately broken copies of the engine and must fail with a message that points at the
fault (and, where it matters, the layers that cannot see the fault must still pass).

A broken copy is a small script written into tmp_path that imports the bundled engine,
monkeypatches one thing, and runs engine.cli.main(): driven with --engine-cmd, exactly as
an external engine would be. Nothing in the engine's production code knows about faults.
"""

from __future__ import annotations

import pytest

from engine.kernels import available_paths
from epmci.perf.machine import cpu_flags
from faults import (FAULT_SET, Q6K_TOO_LARGE, SLOT_BEFORE_READ, THREAD_DEPENDENT_SUM, WRONG_SIZE_PREFETCH,
                    broken_engine, results, run_check, statuses)

pytestmark = pytest.mark.usefixtures("built_engine")


# ----------------------------------------------------------------- kernel layer

def test_kernel_catches_wrong_q6k_scale(tmp_path, tiny_model):
    """Q6_K products 0.2% too large (on every kernel path): the Q6_K experts fail, the Q5_K
    ones pass."""
    cmd = broken_engine(tmp_path, Q6K_TOO_LARGE)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel",
                        "--set", "kernel.pairs=[[0, 0], [1, 7]]")
    assert rc == 1
    st = statuses(rep, "kernel")          # the default path and each declared one (all broken)
    assert len(st) == 8 and {s for n, s in st.items() if n.startswith("L0 E0")} == {"pass"} and \
        {s for n, s in st.items() if n.startswith("L1 E7")} == {"fail"}, st
    bad = {r["name"]: r for r in results(rep, "kernel")}["L1 E7"]
    assert "Q6_K" in bad["message"] and "expert output differs from the reference" in bad["message"]
    assert "slot bytes" not in bad["message"]          # the bytes were right, the math was not
    assert bad["properties"]["max_abs_err"] > 0


@pytest.mark.skipif(available_paths()[-1] == "portable", reason="needs a CPU with AVX2")
def test_kernel_catches_a_fault_on_one_kernel_path_only(tmp_path, tiny_model):
    """The 256-bit k-quant product (the avx2 path) 0.1 % off: the default path (the fastest
    this CPU runs) and the others pass, every [avx2] result fails -- on a runner whose
    default is avx512 only the declared paths can catch it."""
    cmd = broken_engine(tmp_path, FAULT_SET["the avx2 k-quant product 0.1 % off"].patch)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel,layer", "--set", "kernel.pairs=[[0, 0], [1, 7]]")
    st = statuses(rep, "kernel")
    failed = {n for n, s in st.items() if s == "fail"}
    default_is_avx2 = available_paths()[-1] == "avx2"            # a CPU without AVX-512: auto takes avx2
    assert rc == 1 and failed == {"L0 E0 [avx2]", "L1 E7 [avx2]"} | ({"L0 E0", "L1 E7"} if default_is_avx2 else set()), st
    layer = statuses(rep, "layer")                 # whole layers of a real prompt on each path, too
    assert {n for n, s in layer.items() if s == "fail"} == {n for n in layer if n.endswith("[avx2]") or
                                                             default_is_avx2 and "[" not in n}, layer
    r = {r["name"]: r for r in results(rep, "kernel")}["L1 E7 [avx2]"]
    assert r["properties"]["kernels"] == "avx2" and "--kernels avx2" in r["details"]


def test_a_kernel_path_this_cpu_lacks_the_flags_for_is_a_skip_naming_them(tmp_path, tiny_model):
    """A path declared as needing an Arm flag, refused on this x86 CPU: a SKIP naming the flag."""
    cmd = broken_engine(tmp_path, """
        import engine.contract_info as C
        C.KERNEL_CPU_FLAGS["sve"] = ("sve",)
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel", "--set", "kernel.pairs=[[0, 0]]")
    st = statuses(rep, "kernel")
    assert rc == 0 and st["L0 E0 [sve]"] == "skip" and st["L0 E0 [portable]"] == "pass", st
    r = {r["name"]: r for r in results(rep, "kernel")}["L0 E0 [sve]"]
    assert r["message"].startswith("this CPU cannot run kernel path sve: it lacks sve: ") and "--kernels" in r["message"]


def test_a_refused_path_whose_flags_are_not_declared_is_a_skip_saying_so(tmp_path, tiny_model):
    cmd = broken_engine(tmp_path, """
        import engine.contract_info as C
        def info(real=C.contract_info):
            d = real()
            d.pop("kernel_cpu_flags")
            d["kernel_paths"].append("vendor")
            return d
        engine.cli.contract_info = info
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel", "--set", "kernel.pairs=[[0, 0]]")
    st = statuses(rep, "kernel")
    assert rc == 0 and st["L0 E0 [vendor]"] == "skip" and st["L0 E0 [portable]"] == "pass", st
    r = {r["name"]: r for r in results(rep, "kernel")}["L0 E0 [vendor]"]
    assert "by the engine's word" in r["message"] and "kernel_cpu_flags" in r["message"]


@pytest.mark.skipif(not {"avx2", "f16c", "avx512f", "avx512bw", "avx512vl"} <= cpu_flags(),
                    reason="needs a CPU with AVX-512 F/BW/VL")
def test_a_declared_kernel_path_refused_on_a_cpu_with_its_flags_fails(tmp_path, tiny_model):
    """The engine claims its avx512 path (and the flags it needs, which this CPU has), then
    refuses it as if the CPU could not: a lie, a FAIL on every result of that path."""
    cmd = broken_engine(tmp_path, """
        import engine.kernels as K
        K.available_paths = lambda: ("portable", "avx2")
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel,layer", "--set", "kernel.pairs=[[0, 0]]")
    st, layer = statuses(rep, "kernel"), statuses(rep, "layer")
    assert rc == 1 and {n for n, s in st.items() if s != "pass"} == {"L0 E0 [avx512]"}, st
    assert {n for n, s in layer.items() if s != "pass"} == {n for n in layer if n.endswith("[avx512]")}, layer
    r = {r["name"]: r for r in results(rep, "kernel")}["L0 E0 [avx512]"]
    assert r["status"] == "fail" and r["message"].startswith("the engine refused kernel path avx512, which it "
                                                             "declares, on a CPU with every flag"), r["message"]


def test_kernel_catches_wrong_offset_in_paged_path(tmp_path, tiny_model):
    """The pager reads expert e-1's bytes for expert e (off by one expert): the selftest's
    slot hash names the expert whose bytes are in the slot; e2e A/B sees it too."""
    cmd = broken_engine(tmp_path, FAULT_SET["an expert read from its predecessor's bytes"].patch)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel,e2e",
                        "--set", "kernel.pairs=[[3, 0], [3, 7]]", "--set", "prompts.e2e=[Hello]")
    assert rc == 1
    st = statuses(rep, "kernel")
    assert st["L3 E0"] == "pass" and st["L3 E7"] == "fail", st
    msg = {r["name"]: r for r in results(rep, "kernel")}["L3 E7"]["message"]
    assert "slot bytes differ from the file's expert bytes" in msg
    assert "holds the bytes of L3 E6" in msg
    e2e = results(rep, "e2e")
    assert [r["status"] for r in e2e] == ["fail"]
    assert "paged differs from --no-pager" in e2e[0]["message"]


def test_kernel_names_a_part_read_a_page_off_by_comparison_not_by_a_crash(tmp_path, tiny_model):
    """Expert 2's down part read from one page later in the file: finite wrong bytes of the
    same tensor (the engine computes with them without crashing). The kernel suite's slot
    comparison names the expert, the part and the offset; the run itself succeeded."""
    cmd = broken_engine(tmp_path, FAULT_SET["expert 2's down part read a page late"].patch)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel", "--set", "kernel.pairs=[[1, 1], [1, 2]]",
                        "--set", "kernel.paths=[]")
    st = statuses(rep, "kernel")
    assert rc == 1 and st == {"L1 E1": "pass", "L1 E2": "fail"}, st
    bad = results(rep, "kernel")[1]
    assert "slot_sha256" in bad["properties"]                 # the run succeeded: a comparison failed
    assert "crashed" not in bad["message"] and "slot bytes differ" in bad["message"], bad["message"]
    assert "L1 E2's bytes with its down part read +4096 B" in bad["message"], bad["message"]
    assert bad["properties"]["slot_holds"] == "L1 E2 down +4096 B"


def test_the_model_check_catches_late_experts_given_each_others_outputs(tmp_path, tiny_model):
    """The experts a layer still reads at its lookup are computed after those in memory; a
    copy that puts their output rows in each other's places gives plausible logits, and the
    paged runs of the model check (the tiny model in its small arena: misses in every layer)
    differ from the reference."""
    cmd = broken_engine(tmp_path, FAULT_SET["the experts read late given each other's outputs"].patch)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "model", "--no-build")
    st = statuses(rep, "model")
    assert rc == 1 and st["prompt positions"] == "fail" and st["decode positions"] == "fail", st
    msg = {r["name"]: r["message"] for r in results(rep, "model")}["prompt positions"]
    assert "differ from the reference" in msg, msg


# ----------------------------------------------------------------- layer & prefetch-stress

def test_prefetch_stress_catches_prefetch_into_wrong_size_slot(tmp_path, tiny_model):
    cmd = broken_engine(tmp_path, WRONG_SIZE_PREFETCH)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "layer,prefetch-stress",
                        "--set", "prefetch_stress.layouts=[mixed]")
    assert rc == 1
    # the demand path (prefetch off) never hits the bug
    assert set(statuses(rep, "layer").values()) == {"pass"}
    stress = results(rep, "prefetch-stress")
    failed = [r for r in stress if r["status"] == "fail"]
    assert failed, stress
    assert all(r["name"].startswith("mixed") for r in failed)
    assert any("MoE output differs from the reference" in r["message"] for r in failed), failed


def test_prefetch_stress_catches_slot_computed_before_read_completed(tmp_path, tiny_model):
    cmd = broken_engine(tmp_path, SLOT_BEFORE_READ)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "prefetch-stress",
                        "--set", "prefetch_stress.layouts=[mixed]")
    assert rc == 1
    failed = [r for r in results(rep, "prefetch-stress") if r["status"] == "fail"]
    assert any("MoE output differs from the reference" in r["message"] for r in failed), failed


# ----------------------------------------------------------------- determinism

def test_determinism_catches_thread_count_dependent_accumulation(tmp_path, tiny_model):
    cmd = broken_engine(tmp_path, THREAD_DEPENDENT_SUM)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "determinism,layer",
                        "--set", "engine.threads=1", "--set", "determinism.threads_alt=2")
    assert rc == 1
    assert set(statuses(rep, "layer").values()) == {"pass"}
    st = statuses(rep, "determinism")
    assert st == {"page cache dropped": "pass", "threads 1 vs 2": "fail", "default settings: counters replayed": "pass"}, st
    msg = results(rep, "determinism")[1]["message"]
    assert "logits not byte-identical with -t 2" in msg


# ----------------------------------------------------------------- fail closed

def test_crashing_engine_fails_with_reason(tmp_path, tiny_model):
    cmd = broken_engine(tmp_path, """
        if "--selftest" in sys.argv:
            print("about to die", file=sys.stderr, flush=True)
            import os; os.abort()
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel", "--set", "kernel.pairs=[[0, 0]]",
                        "--set", "kernel.paths=[]")
    assert rc == 1
    (r,) = results(rep, "kernel")
    assert r["status"] == "fail"
    assert "engine crashed (SIGABRT)" in r["message"]
    assert "about to die" in r["stderr_tail"]


def test_a_crash_in_a_batched_selftest_run_fails_every_pair_with_its_reason(tmp_path, tiny_model):
    """The kernel suite runs a kernel path's pairs in one engine run (feature selftest_batch):
    an engine that dies after the first selftest fails each pair of the run, each with the
    crash and the run's command."""
    cmd = broken_engine(tmp_path, """
        import engine.selftest as S
        _one, _done = S.run_selftest, []
        def run_selftest(engine, spec):
            if _done:
                print("about to die", file=sys.stderr, flush=True)
                import os; os.abort()
            _done.append(spec)
            return _one(engine, spec)
        S.run_selftest = run_selftest
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel", "--set", "kernel.pairs=[[0, 0], [3, 7]]",
                        "--set", "kernel.paths=[]")
    assert rc == 1 and statuses(rep, "kernel") == {"L0 E0": "fail", "L3 E7": "fail"}
    for r in results(rep, "kernel"):
        assert "engine crashed (SIGABRT)" in r["message"] and "about to die" in r["stderr_tail"], r
        assert r["details"].count("--selftest") == 2, r["details"]


def test_a_batched_selftest_computed_from_the_previous_ones_slot_is_caught(tmp_path, tiny_model):
    """A fault only a batch can have: after the first selftest of the run the engine reads no
    more experts and computes each later one from the slot it already has (stale state
    carried between selftests). The later pair fails naming whose bytes it got; the first
    passes."""
    cmd = broken_engine(tmp_path, """
        import engine.paging.pager as P
        _load, _first = P.Pager.load_slot, []
        def load_slot(self, il, e):
            if not _first:
                _first.append(_load(self, il, e))
            return _first[0]
        P.Pager.load_slot = load_slot
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel", "--set", "kernel.pairs=[[1, 1], [1, 2]]",
                        "--set", "kernel.paths=[]")
    assert rc == 1 and statuses(rep, "kernel") == {"L1 E1": "pass", "L1 E2": "fail"}, statuses(rep, "kernel")
    bad = results(rep, "kernel")[1]
    assert "slot bytes differ" in bad["message"] and "holds the bytes of L1 E1" in bad["message"], bad["message"]


def test_an_engine_without_selftest_batch_is_given_one_selftest_per_run(tmp_path, tiny_model):
    """An engine that does not declare selftest_batch (and refuses a second --selftest) gets
    one run per pair, and passes."""
    cmd = broken_engine(tmp_path, """
        import engine.contract_info as C
        C.FEATURES = tuple(f for f in C.FEATURES if f != "selftest_batch")
        if sys.argv.count("--selftest") > 1:
            print("epm-engine: error: --selftest: given twice", file=sys.stderr)
            sys.exit(2)
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel", "--set", "kernel.pairs=[[0, 0], [3, 7]]")
    st = statuses(rep, "kernel")
    assert rc == 0 and set(st.values()) == {"pass"} and len(st) == 2 * (1 + len(available_paths())), st
    assert all(r["details"].count("--selftest") == 1 for r in results(rep, "kernel"))


def test_hanging_engine_times_out(tmp_path, tiny_model):
    cmd = broken_engine(tmp_path, """
        if "--contract-info" not in sys.argv:     # it says what it is, then hangs on every run
            print("stuck", file=sys.stderr, flush=True)
            time.sleep(600)
    """)
    t0 = __import__("time").perf_counter()
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel", "--set", "kernel.pairs=[[0, 0]]",
                        "--set", "kernel.paths=[]", "--timeout", "3")
    assert __import__("time").perf_counter() - t0 < 60
    assert rc == 1
    (r,) = results(rep, "kernel")
    assert r["status"] == "fail" and "timed out after 3 s" in r["message"]
    assert "stuck" in r["stderr_tail"]


def test_missing_dump_and_slot_error_fail(tmp_path, tiny_model):
    """An engine that writes no MoE dump and prints a SLOT-ERROR: never a pass."""
    cmd = broken_engine(tmp_path, """
        import os
        os.environ.pop("SDQ_MOE_DUMP", None)
        if os.environ.get("SDQ_PREFETCH") == "1":
            print("[epm] SLOT-ERROR slot 3 holds (1, 2), computed as (1, 5)", file=sys.stderr)
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "layer,prefetch-stress",
                        "--set", "prefetch_stress.layouts=[uniform]", "--layers", "0", "--set", "kernel.paths=[]")
    assert rc == 1
    (r,) = results(rep, "layer")
    assert r["status"] == "fail" and "MoE dump unusable" in r["message"] and "missing" in r["message"]
    st = statuses(rep, "prefetch-stress")
    assert st == {"uniform run": "fail", "uniform L0": "fail"}
    head = results(rep, "prefetch-stress")[0]
    assert "SLOT-ERROR slot 3" in head["message"]


def test_engine_refusing_the_arena_is_reported(tmp_path, tiny_model):
    """An arena the engine refuses (exit 2) in every run is a setting that cannot work: the
    check fails with the engine's message, and epmci exits 2 (could not run), not 1."""
    rc, rep = run_check(tmp_path, tiny_model, None, "--no-build", "--suites", "kernel",
                        "--set", "kernel.pairs=[[0, 0]]", "--set", "kernel.paths=[]", "--arena-mb", "0.01")
    assert rc == 2 and "the engine refused every run (exit 2)" in rep["tool_error"] and "minimum" in rep["tool_error"]
    (r,) = results(rep, "kernel")
    assert r["status"] == "fail" and "engine refused to run (exit 2)" in r["message"] and "minimum" in r["message"]


def test_the_default_settings_counters_are_replayed(tmp_path, tiny_model):
    """determinism's first run, on the engine's default paging settings and arena, is replayed
    on the contract's cache policy: an LRU that ignores hits passes every comparison between
    runs (it is deterministic) and fails the replay."""
    from test_shapes import POLICY_FAULTS
    says = POLICY_FAULTS["LRU order not updated on a hit"]
    rc, rep = run_check(tmp_path, tiny_model, broken_engine(tmp_path, FAULT_SET["LRU order not updated on a hit"].patch),
                        "--suites", "determinism")
    st = statuses(rep, "determinism")
    assert rc == 1 and st == {"page cache dropped": "pass", "threads 1 vs 2": "pass", "threads 1 vs 3": "pass",
                              "default settings: counters replayed": "fail"}, st
    assert says in results(rep, "determinism")[-1]["message"]


def test_an_engine_that_breaks_at_start_up_is_a_failing_engine(tmp_path, tiny_model):
    """A short read in the engine's start-up warm-up, reported by the engine as a refusal
    (exit 2, one line) on every run: at the contract's settings, on a model epmci validated
    and the engine declares it runs, that is the engine's defect -- exit 1 with the engine's
    line in every failure, not exit 2 (which a user reads as the gate being broken)."""
    cmd = broken_engine(tmp_path, FAULT_SET["a short read in the start-up warm-up"].patch)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel,layer,determinism")
    assert rc == 1 and not rep.get("tool_error"), rep.get("tool_error")
    assert "short read" in rep["meta"]["engine_refused_every_run"]
    failed = [r for s in rep["suites"] for r in s["results"] if r["status"] == "fail"]
    assert failed and all("engine refused to run (exit 2)" in r["message"] and "short read" in r["message"]
                          for r in failed)


def test_a_refused_build_is_the_engines_unless_the_user_set_what_it_refuses(tiny_model):
    """...or the model is one the engine does not declare it runs (tests/test_corrupt_models.py:
    a Q4_0 tensor stays exit 2)."""
    from epmci.check.runner import changed_engine_settings, engine_at_fault
    from epmci.config.schema import CheckConfig
    from epmci.contract.build import BuildResult
    from epmci.contract.process import EngineCommand
    from epmci.gguf.file import ModelFile
    engine, mf = EngineCommand.from_setting(None, {}), ModelFile(tiny_model)
    from epmci.perf.settings import for_model
    refused = BuildResult(False, "bundled engine", "warm-up run (paged path) failed (exit 2): ...", refused=True)
    cfg, _ = for_model(CheckConfig(), mf)
    assert engine_at_fault(refused, cfg, engine, mf) and engine_at_fault(BuildResult(False, "x", "crash"), cfg, engine, mf)
    cfg.run.arena_mb = 0.01
    assert changed_engine_settings(cfg) == ["run.arena_mb=0.01"] and not engine_at_fault(refused, cfg, engine, mf)
    assert not engine_at_fault(BuildResult(False, "x", "not found", cannot_start=True), for_model(CheckConfig(), mf)[0],
                               engine, mf)


def test_the_replay_takes_the_settings_engine_env_gives_every_run(tmp_path, tiny_model):
    """engine.env's SDQ_* values reach every run under the run's own: the replay of the
    default-settings run uses them too, so a correct engine passes with a small queue set there."""
    rc, rep = run_check(tmp_path, tiny_model, None, "--no-build", "--suites", "determinism", "--set",
                        "engine.env={SDQ_PREFETCH_QUEUE: '1', SDQ_PREFETCH_STALE_TOKENS: '0'}")
    r = {r["name"]: r for r in results(rep, "determinism")}["default settings: counters replayed"]
    assert rc == 0 and r["status"] == "pass", r["message"]


def test_fail_fast_skips_what_had_not_started_at_the_first_failure(tmp_path, tiny_model):
    """--fail-fast: one worker, the determinism runs first (the costliest tasks) and fail; a
    check not yet started then is a SKIP naming that failure, none is dropped."""
    args = ("--suites", "determinism,kernel", "--set", "kernel.pairs=[[0, 0], [1, 7]]", "--set", "kernel.paths=[]",
            "--jobs", "1", "--set", "engine.threads=1", "--set", "determinism.threads_alt=2")
    cmd = broken_engine(tmp_path, THREAD_DEPENDENT_SUM)
    (tmp_path / "full").mkdir()
    (tmp_path / "ff").mkdir()
    rc, full = run_check(tmp_path / "full", tiny_model, cmd, *args)
    rc_ff, rep = run_check(tmp_path / "ff", tiny_model, cmd, *args, "--fail-fast")
    assert rc == rc_ff == 1 and rep["meta"]["fail_fast"] is True
    names = lambda r: sorted((s["name"], x["name"]) for s in r["suites"] for x in s["results"])
    assert names(rep) == names(full)
    failed = [(s["name"], x["name"]) for s in rep["suites"] for x in s["results"] if x["status"] == "fail"]
    skipped = {x["message"] for s in rep["suites"] for x in s["results"] if x["properties"].get("skipped_by") == "fail-fast"}
    assert failed and "skip" in statuses(rep, "kernel").values(), rep["suites"]
    (message,) = skipped
    assert message.startswith("not run: --fail-fast stopped the check at its first failure (")
    assert any(message.endswith(f"({s} / {n})") for s, n in failed), (message, failed)


def test_fail_fast_does_not_stop_at_a_refusal():
    """Whether the engine refused every run decides exit 1 or 2, so a refused run does not
    stop --fail-fast; the first real failure does, and a task after it is a SKIP."""
    from epmci.check.result import CheckResult
    from epmci.check.runner import REFUSED, _execute
    from epmci.check.suites.base import Task
    said = {"refused": ("fail", REFUSED + "arena below the minimum"), "passes": ("pass", "ok"),
            "fails": ("fail", "logits differ"), "after": ("pass", "ok")}
    tasks = [(i, Task("s", n, lambda n=n: [CheckResult("s", n, *said[n])], names=[n], cost=10 - i))
             for i, n in enumerate(said)]
    out: list = []
    _execute(tasks, 1, out.append, {}, {}, fail_fast=True)
    st = {r.name: r.status for r in out}
    assert st == {"refused": "fail", "passes": "pass", "fails": "fail", "after": "skip"}, st
    assert out[-1].message.endswith("first failure (s / fails)")


def test_the_hidden_state_check_fails_closed_on_logits_short_of_the_positions():
    from epmci.check.cache_check import hidden_state_problem
    from epmci.contract.cache_model import Lookup
    ctx = type("Ctx", (), {"shared": lambda self, key, make: None, "mf": None})()
    facts = type("Facts", (), {"n_layer": 1})()
    lookups = [Lookup("prefill", 0, [1], 0, 4), Lookup("decode", 0, [2], 1, 1)]
    says = hidden_state_problem(ctx, facts, [], lookups, 0, None, [1, 2, 3])
    assert says.startswith("the logits have 3 rows, but the run evaluated 5 positions"), says
