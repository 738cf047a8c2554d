"""An engine declares what it can do (`--contract-info`, docs/engine-contract.md, Capabilities),
and the gate takes it at its word: a suite needing a feature the engine lacks is one SKIP
"engine lacks <feature>" in every output (console, JSON, JUnit), the pager's flags go only to
an engine with a pager, a summary says which suites ran, and a documented stats field left
out is a failure naming it. Engines here are copies of the bundled one, patched in a wrapper
script and driven with --engine-cmd."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from epmci.contract.capabilities import FEATURES, model_problem, parse_contract_info
from epmci.contract.outputs import STATS_FIELDS, ContractError, read_stats
from epmci.contract.process import EngineCommand
from epmci.contract.runspec import RunSpec
from faults import broken_engine, results, run_check, statuses

PAGER_FLAGS = ("--arena-mb", "--ram-budget-mb", "--no-prefetch", "--no-pager", "--profile-out", "--selftest")
# A copy of the bundled engine without a pager, as an honest engine without one would be: it
# declares no pager and refuses the pager's flags with the contract's one line, exit 2.
NO_PAGER = f"""
    import engine.contract_info as CI
    CI.FEATURES = ("moe_dump",)
    bad = [x for x in sys.argv[1:] if x in {PAGER_FLAGS!r}]
    if bad:
        print(f"nopager: error: {{bad[0]}}: this engine has no pager", file=sys.stderr)
        sys.exit(2)
"""


def engine_cli(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *map(str, args)], capture_output=True, text=True,
                          check=check, timeout=300)


# ----------------------------------------------------------------- the declaration

def test_bundled_engine_declares_contract_2_and_its_features():
    r = engine_cli("--contract-info")
    caps = parse_contract_info(r.stdout, "bundled")
    assert caps.contract == 2 and caps.name == "epm-engine" and caps.version
    assert caps.architectures == ("qwen3moe", "qwen35moe") and {"Q4_K", "Q5_K", "Q6_K", "Q8_0", "F32"} <= set(caps.quant_types)
    assert {"pager", "selftest", "selftest_batch", "moe_dump", "prefetch_dump", "state_dump", "profile",
            "teacher_forcing", "pacing", "reference_exact"} == caps.features <= set(FEATURES)
    assert caps.kernel_cpu_flags["portable"] == () and caps.kernel_cpu_flags["avx512"] >= ("avx2", "f16c")
    assert model_problem(caps, "qwen3moe", {"Q4_K", "F32"}) is None
    assert "not llama" in model_problem(caps, "llama", {"Q4_K"})
    assert model_problem(caps, "qwen3moe", {"IQ2_XS", "F32"}).startswith("unsupported type IQ2_XS: epm-engine")


@pytest.mark.parametrize("text, problem", [
    ("not json", "did not print one JSON object"),
    ("[1]", "not a JSON object"),
    ('{"engine": {"name": "x"}, "architectures": [], "quant_types": [], "features": []}', "contract"),
    ('{"contract": 2, "engine": {}, "architectures": [], "quant_types": [], "features": []}', "name"),
    ('{"contract": 2, "engine": {"name": "x"}, "architectures": "qwen3moe", "quant_types": [], "features": []}',
     "architectures"),
    ('{"contract": 2, "engine": {"name": "x"}, "architectures": [], "quant_types": [], "features": [], '
     '"kernel_paths": ["auto"]}', "kernel_paths"),
    ('{"contract": 2, "engine": {"name": "x"}, "architectures": [], "quant_types": [], "features": [], '
     '"kernel_paths": ["a"], "kernel_cpu_flags": {"b": []}}', "kernel_cpu_flags"),
    ('{"contract": 2, "engine": {"name": "x"}, "architectures": [], "quant_types": [], "features": [], '
     '"kernel_paths": ["a"], "kernel_cpu_flags": {"a": "avx2"}}', "kernel_cpu_flags"),
])
def test_a_malformed_declaration_is_named(text, problem):
    with pytest.raises(ContractError, match=problem):
        parse_contract_info(text, "engine")


@pytest.mark.parametrize("args, words", [
    (["--no-such-flag", "-m", "x.gguf"], ["unrecognized arguments: --no-such-flag"]),
    (["-m", "x.gguf", "-n", "two"], ["-n/--n-predict", "invalid int value"]),
    (["-p", "hello"], ["-m/--model", "required"]),
])
def test_a_bad_command_line_is_one_line_exit_2(args, words):
    """Not argparse's usage text: the contract's one line, naming the flag."""
    r = engine_cli(*args, check=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("epm-engine: error: ") and all(w in lines[0] for w in words), lines


# ----------------------------------------------------------------- the command line follows the declaration

def test_pager_flags_go_only_to_an_engine_with_a_pager():
    spec = RunSpec("hi", arena_mb=3.0, ram_budget_mb=512, prefetch=False, profile_out="/p")
    paged = spec.args("/m.gguf", Path("/o"))
    assert all(f in paged for f in ("--arena-mb", "--ram-budget-mb", "--no-prefetch", "--profile-out"))
    plain = spec.args("/m.gguf", Path("/o"), pager_flags=False)
    assert not set(plain) & set(PAGER_FLAGS) and "--stats-file" in plain and "--dump-logits" in plain
    assert EngineCommand(("x",), False).has("pager")                       # never asked: driven as contract v1
    assert not EngineCommand(("x",), False).with_features(["moe_dump"]).has("pager")


def test_a_missing_stats_field_is_a_failure_naming_it(tmp_path):
    p = tmp_path / "s.jsonl"
    rec = {f: 0 for f in STATS_FIELDS}
    rec["phase"] = "prefill"
    p.write_text(json.dumps({k: v for k, v in rec.items() if k not in ("hits", "io_bytes")}) + "\n")
    with pytest.raises(ContractError, match=r"line 1 \(prefill\) lacks the documented field\(s\) hits, io_bytes"):
        read_stats(p, STATS_FIELDS)
    assert read_stats(p, ("phase", "tokens", "seconds"))[0]["phase"] == "prefill"


# ----------------------------------------------------------------- the gate on engines that lack features

@pytest.mark.usefixtures("built_engine")
def test_an_engine_without_a_pager_is_gated_by_what_it_has(tmp_path, tiny_model):
    """Every suite that needs the pager is a SKIP saying so -- in the JSON, the JUnit and the
    console -- never dropped; the others run (determinism and model pass: none of their runs
    got a pager flag, which this engine refuses) and the summary says which ran."""
    cmd = broken_engine(tmp_path, NO_PAGER)
    junit = tmp_path / "j.xml"
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "kernel,layer,e2e,determinism,budget",
                        "--junit-xml", str(junit))
    assert rc == 0, rep
    assert statuses(rep, "kernel") == {"kernel": "skip"} and statuses(rep, "e2e") == {"e2e": "skip"}
    assert statuses(rep, "budget") == {"budget": "skip"}
    kernel = results(rep, "kernel")[0]
    assert kernel["message"].startswith("engine lacks pager, selftest") and kernel["properties"]["lacks"] == [
        "pager", "selftest"]
    assert set(statuses(rep, "layer").values()) == {"pass"}               # moe_dump it has
    det = results(rep, "determinism")
    assert [r["status"] for r in det] == ["pass", "pass", "pass", "skip"] and "no paging counters" in det[0]["message"]
    assert rep["meta"]["engine_contract"]["features"] == ["moe_dump"]
    xml = junit.read_text()
    assert 'name="epmci.kernel"' in xml and "engine lacks pager, selftest" in xml
    from epmci.report.text import coverage
    from epmci.check.result import CheckReport, CheckResult
    report = CheckReport([CheckResult(s["name"], r["name"], r["status"], r["message"])
                          for s in rep["suites"] for r in s["results"]], meta=rep["meta"])
    line = coverage(report)
    assert line.startswith("suites run: layer, determinism; skipped: kernel (engine lacks pager, selftest")
    assert "not selected: contract, prefetch-stress, model, switches, perf" in line


@pytest.mark.usefixtures("built_engine")
def test_fast_says_truthfully_which_layers_the_skipped_ab_rests_on(tmp_path, tiny_model):
    rc, rep = run_check(tmp_path, tiny_model, None, "--no-build", "--fast", "--suites", "e2e,determinism")
    assert rc == 0
    msg = results(rep, "e2e")[0]["message"]
    assert "equivalence rests on the determinism layer)" in msg and "kernel" not in msg


@pytest.mark.usefixtures("built_engine")
def test_stats_with_documented_fields_left_out_fail_naming_them(tmp_path, tiny_model):
    """With 6 of the documented fields written, determinism must not pass on '2 counters identical'."""
    cmd = broken_engine(tmp_path, """
        import engine.stats as S
        good = S.PhaseStats.record
        S.PhaseStats.record = lambda self: {k: v for k, v in good(self).items()
                                            if k in ("phase", "tokens", "seconds", "tok_s", "hits", "peak_rss_mb")}
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "determinism")
    assert rc == 1
    for r in results(rep, "determinism"):
        assert r["status"] == "fail"
        assert "lacks the documented field(s) hit_rate, misses, evictions" in r["message"], r["message"]


def test_an_engine_that_cannot_say_what_it_is_is_exit_2_unless_declared(tmp_path, tiny_model, capsys):
    """Without --contract-info the gate cannot know what to run: exit 2 naming the way out;
    with engine.features in epmci.yaml it runs on that declaration."""
    cmd = broken_engine(tmp_path, """
        if "--contract-info" in sys.argv:
            print("old-engine: error: unrecognized arguments: --contract-info", file=sys.stderr)
            sys.exit(2)
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "e2e", "--fast")
    assert rc == 2
    assert "--contract-info" in rep["tool_error"] and "engine.features" in rep["tool_error"]
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "e2e,kernel", "--fast",
                        "--set", "engine.features=[moe_dump]")
    assert rc == 0 and statuses(rep, "kernel") == {"kernel": "skip"}
    assert "engine.features" in results(rep, "kernel")[0]["message"]


def test_a_model_the_engine_does_not_declare_is_exit_2(tmp_path, tiny_model):
    cmd = broken_engine(tmp_path, """
        import engine.contract_info as CI
        good = CI.contract_info
        engine.cli.contract_info = lambda: {**good(), "architectures": ["llama"]}
    """)
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "determinism")
    assert rc == 2 and "runs llama by its --contract-info, not qwen3moe" in rep["tool_error"]
