"""The result model, renderers, config and contract readers of `epmci check` -- no engine runs."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from lxml import etree

from epmci import report as rep
from epmci.check.result import CheckReport, CheckResult, SuiteInfo
from epmci.compare.arrays import Tolerance, compare_arrays
from epmci.compare.logits import compare_logits, logits_verdict
from epmci.config import CheckConfig, find_config, load_config, parse_set
from epmci.contract.outputs import (ContractError, read_logits, read_moe_dump, read_selftest, read_stats,
                               slot_errors, counters_of)
from epmci.errors import InputError

REPO = Path(__file__).resolve().parent.parent
XSD = Path(__file__).parent / "data" / "junit-10.xsd"


def validate_junit(path_or_text) -> None:
    schema = etree.XMLSchema(etree.parse(str(XSD)))
    doc = etree.parse(str(path_or_text)) if isinstance(path_or_text, Path) else \
        etree.fromstring(path_or_text.encode())
    tree = doc if isinstance(doc, etree._ElementTree) else etree.ElementTree(doc)
    assert schema.validate(tree), schema.error_log


def sample_report() -> CheckReport:
    r = CheckReport(suites=[SuiteInfo("kernel", "kernel"), SuiteInfo("perf", "perf (a later suite)")],
                    meta={"model": "m.gguf", "engine": "bundled", "config": "epmci.yaml", "fast": True})
    r.results = [
        CheckResult("kernel", "L0 E0", "pass", "max_abs_err 0", {"max_abs_err": 0.0, "rows": 4}, 1.5, order=1),
        CheckResult("kernel", "L5 E63", "fail", "L5 E63: output differs: max_abs_err 0.03 | <&> \"q\"",
                    {"max_abs_err": 0.03, "suspect_experts": [3, 4]}, 2.25, "stderr line\n\x1b[31mred\x00",
                    "command: x", order=2),
        CheckResult("perf", "tok/s ci", "skip", "skipped by --no-perf", {"tok_s": 1e-7}, 0.0, order=3),
        CheckResult("e2e", "e2e A/B", "error", "internal error: boom", {}, 1e-6, order=4),
    ]
    r.seconds = 12.5
    return r


# ----------------------------------------------------------------- rendering

def test_junit_is_valid_and_carries_numbers(tmp_path):
    path = tmp_path / "j.xml"
    rep.write_junit(sample_report(), path)
    validate_junit(path)
    root = etree.parse(str(path)).getroot()
    assert root.get("tests") == "4" and root.get("failures") == "1" and root.get("errors") == "1"
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"epmci.kernel", "epmci.perf", "epmci.e2e"}
    k = suites["epmci.kernel"]
    props = {p.get("name"): p.get("value") for p in k.iter("property")}
    assert props["L5 E63.max_abs_err"] == "0.03"
    assert props["L5 E63.suspect_experts"] == "[3, 4]"
    assert props["epmci.model"] == "m.gguf"
    fail = k.find("testcase[@name='L5 E63']/failure")
    assert "max_abs_err 0.03" in fail.get("message")
    assert "stderr line" in k.find("testcase[@name='L5 E63']/system-err").text
    assert suites["epmci.perf"].find("testcase/skipped").get("message") == "skipped by --no-perf"
    assert suites["epmci.e2e"].find("testcase/error") is not None


def test_json_markdown_console_render_any_suite(tmp_path, monkeypatch):
    report = sample_report()
    d = json.loads(rep.json_string(report))
    assert d["verdict"] == "FAIL" and d["exit_code"] == 1
    assert [s["name"] for s in d["suites"]] == ["kernel", "perf", "e2e"]
    assert d["suites"][0]["results"][1]["properties"]["suspect_experts"] == [3, 4]
    md = rep.markdown(report)
    assert "## epmci check: FAIL" in md and "### perf (" in md and "| tok/s ci |" in md
    # the line that matters comes right after the verdict: the first failing check and why
    first = md.splitlines()[0]
    assert first.startswith("## epmci check: FAIL ❌ -- kernel / L5 E63: ") and "max_abs_err 0.03" in first, first
    assert "(and 1 more)" in md.splitlines()[2]
    assert "skipped by --no-perf" in md and "<details>" in md
    con = rep.render_console(report, width=120)
    assert "L5 E63" in con and "Failures:" in con and "1 passed, 1 failed, 1 errors, 1 skipped" in con
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert rep.append_step_summary(report) == summary
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "## epmci check: FAIL" in text
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    assert rep.append_step_summary(report) is None


def test_exit_codes_of_the_report():
    r = CheckReport(results=[CheckResult("a", "x", "pass"), CheckResult("a", "y", "skip")])
    assert r.exit_code == 0 and r.verdict == "PASS"
    r.results.append(CheckResult("a", "z", "error"))
    assert r.exit_code == 1
    r.tool_error = "model: no such file"
    assert r.exit_code == 2
    junit = rep.junit_string(r)          # a JUnit reader sees the tool's error too, not 2 passes and an error
    validate_junit(junit)
    assert 'errors="2"' in junit and 'message="model: no such file"' in junit
    assert CheckReport().exit_code == 1          # nothing ran: not a pass
    with pytest.raises(ValueError):
        CheckResult("a", "b", "passed")


def test_progress_lines(capsys):
    p = rep.ConsoleProgress()
    p.planned(2)
    p(CheckResult("kernel", "L0 E0", "pass", "ok", seconds=1.0))
    out = capsys.readouterr().out
    assert out.startswith("[1/2] kernel") and "PASS" in out


# ----------------------------------------------------------------- comparisons

def test_compare_arrays_tolerance_nan_and_empty():
    ref = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    assert compare_arrays(ref.copy(), ref, Tolerance()).ok
    got = ref.copy()
    got[1, 0] += 1e-3
    d = compare_arrays(got, ref, Tolerance())
    assert not d.ok and d.worst == (1, 0) and list(d.bad_rows) == [1]
    assert compare_arrays(got, ref, Tolerance(atol=2e-3)).ok
    assert compare_arrays(got, ref, Tolerance(rtol=1e-3)).ok
    got[0, 0] = np.nan
    d = compare_arrays(got, ref, Tolerance(atol=1.0))
    assert not d.ok and d.n_nan == 1
    assert not compare_arrays(np.zeros((0, 2)), np.zeros((0, 2)), Tolerance()).ok   # empty: not a pass
    assert "shape" in compare_arrays(ref[:1], ref, Tolerance()).text()


def test_logits_modes():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 50)).astype(np.float32)
    assert logits_verdict(compare_logits(a, a.copy()), "exact", 0)
    b = a + np.float32(1e-4)
    b[1, 7] += np.float32(1e-3)
    d = compare_logits(a, b)
    assert not d.identical and d.rows_differ == 3
    assert not logits_verdict(d, "exact", 0)
    assert logits_verdict(d, "argmax", 0)
    assert logits_verdict(d, "kl", 1e-5) and not logits_verdict(d, "kl", 0.0)
    c = a.copy()
    c[2] = -c[2]
    assert not logits_verdict(compare_logits(a, c), "argmax", 0)
    assert not logits_verdict(compare_logits(a, a[:2]), "kl", 1.0)          # row counts differ
    assert not logits_verdict(compare_logits(a[:0], a[:0]), "exact", 0)     # empty


# ----------------------------------------------------------------- contract readers

def test_readers_reject_malformed_files(tmp_path):
    p = tmp_path / "f"
    with pytest.raises(ContractError, match="missing"):
        read_logits(p)
    p.write_bytes(struct.pack("<i", 4) + b"\0" * 10)
    with pytest.raises(ContractError, match="whole number of rows"):
        read_logits(p)
    p.write_bytes(struct.pack("<i", 2) + np.arange(4, dtype="<f4").tobytes())
    assert read_logits(p).shape == (2, 2)
    rec = b"EPMD" + struct.pack("<5I", 1, 3, 2, 4, 2) + b"\0" * (4 * (2 * 4 * 2 + 2 * 2 * 2))
    p.write_bytes(rec + rec[:30])
    with pytest.raises(ContractError, match="truncated"):
        read_moe_dump(p)
    p.write_bytes(rec)
    assert read_moe_dump(p, layer=3, n_embd=4, k=2).n_rows == 2
    with pytest.raises(ContractError, match="layer 3, expected 4"):
        read_moe_dump(p, layer=4)
    p.write_bytes(b"")
    with pytest.raises(ContractError, match="empty"):
        read_moe_dump(p)
    st = b"EPMS" + struct.pack("<5I", 1, 0, 5, 1, 2) + b"s" * 32 + np.zeros(4, "<f4").tobytes()
    p.write_bytes(st)
    assert read_selftest(p, layer=0, expert=5).expert == 5
    with pytest.raises(ContractError, match="expert 5, expected 6"):
        read_selftest(p, expert=6)
    p.write_bytes(st[:-1])
    with pytest.raises(ContractError):
        read_selftest(p)
    p.write_text('{"phase": "prefill", "tokens": 3, "seconds": 1.0, "hits": 2}\nnot json\n')
    with pytest.raises(ContractError, match="line 2"):
        read_stats(p)
    p.write_text('{"phase": "prefill", "tokens": 3, "seconds": 1.0, "hits": 2}\n')
    assert counters_of(read_stats(p)) == {"prefill": {"tokens": 3, "hits": 2}}
    p.write_text('{"phase": "prefill", "tokens": 3.0, "seconds": 0, "hit_rate": 12.5}\n{"phase": "decode", "tokens": 1}\n')
    assert [r["tokens"] for r in read_stats(p)] == [3.0, 1]
    assert slot_errors("x\n[epm] SLOT-ERROR slot 1 bad\n") == ["[epm] SLOT-ERROR slot 1 bad"]


# ----------------------------------------------------------------- config

def test_repo_config_is_found_and_equals_the_defaults(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO / "tests")
    assert find_config() == REPO / "epmci.yaml"
    cfg = load_config()
    assert cfg.source == str(REPO / "epmci.yaml")
    assert cfg.to_dict() == CheckConfig().to_dict()
    monkeypatch.chdir(tmp_path)
    if find_config() is None:
        assert load_config().source == "<defaults>"


def test_suite_registry_and_setting_names_agree():
    """The suites the settings accept are exactly the registered ones, in report order."""
    from epmci.check.suites import SUITES
    from epmci.config.schema import SUITE_NAMES
    assert tuple(SUITES) == SUITE_NAMES
    assert tuple(CheckConfig().suites) == tuple(s for s in SUITE_NAMES if s != "contract")   # on request only


def test_config_overrides_and_errors(tmp_path):
    cfg = load_config(search=False, overrides=parse_set(
        ["layer.tolerance.atol=1e-6", "kernel.pairs=[[0, 1]]", "engine.cmd=./bin --x", "run.arena_mb=12"]))
    assert cfg.layer.tolerance.atol == 1e-6 and cfg.kernel.pairs == [[0, 1]]
    assert cfg.engine.cmd == "./bin --x" and cfg.run.arena_mb == 12.0
    bad = tmp_path / "bad.yaml"
    for text, msg in (("nope: 1\n", "unknown setting 'nope'"),
                      ("engine: {threads: two}\n", "engine.threads must be int"),
                      ("e2e: {compare: fuzzy}\n", "e2e.compare"),
                      ("suites: [kernel, perf2]\n", "suites: unknown"),
                      ("layer: {tolerance: {atol: -1}}\n", "atol"),
                      ("run: {memory_mb: 0}\n", "run.memory_mb must be"),
                      ("run: {memory_mb: lots}\n", "run.memory_mb must be"),
                      ("[1, 2]\n", "top level must be a mapping"),
                      ("a: [\n", "not valid YAML")):
        bad.write_text(text)
        with pytest.raises(InputError, match=msg.replace("[", r"\[").replace("(", r"\(")):
            load_config(bad)
    with pytest.raises(InputError, match="config file not found"):
        load_config(tmp_path / "none.yaml")
    with pytest.raises(InputError, match="KEY=VALUE"):
        parse_set(["novalue"])


# ----------------------------------------------------------------- the runner, with a plugged-in suite

def test_runner_plugs_in_a_suite_and_fails_closed(monkeypatch, tiny_model, tmp_path):
    """A new suite needs only a SUITE object in the registry: its tasks run in the pool,
    results come back in plan order whatever the completion order, a task that raises or
    returns nothing is an `error`, and every renderer handles it."""
    import time as _time

    from epmci.check import runner, suites
    from epmci.check.suites.base import Task

    class FakePerf:
        name, title, description = "perf", "perf: a later suite", "tok/s against golden baselines"

        def plan(self, ctx):
            def slow():
                _time.sleep(0.3)
                return [CheckResult("perf", "slow", "pass", "12.5 tok/s", {"tok_s": 12.5})]

            def boom():
                raise RuntimeError("the baseline file is unreadable")

            return [Task("perf", "slow", slow, ["slow"], cost=1),
                    Task("perf", "boom", boom, ["boom"], cost=1),
                    Task("perf", "empty", lambda: [], ["empty"], cost=1),
                    CheckResult("perf", "drift", "skip", "skipped by --no-perf")]

    monkeypatch.setitem(suites.SUITES, "perf", FakePerf())
    cfg = load_config(search=False, overrides={"model": str(tiny_model), "suites": ["perf"],
                                               "run": {"jobs": 3}})
    seen = []
    report = runner.run_check(cfg, seen.append, build=False, workdir=tmp_path)
    assert [r.name for r in report.by_suite()["perf"]] == ["slow", "boom", "empty", "drift"]
    st = {r.name: r.status for r in report.results}
    assert st == {"slow": "pass", "boom": "error", "empty": "error", "drift": "skip"}
    boom = next(r for r in report.results if r.name == "boom")
    assert "the baseline file is unreadable" in boom.message and "Traceback" in boom.details
    assert len(seen) == 4 and report.exit_code == 1
    assert report.meta["workdir_kept"]                      # kept for inspection: not all passed
    path = tmp_path / "j.xml"
    rep.write_junit(report, path)
    validate_junit(path)
    assert "perf" in rep.markdown(report) and json.loads(rep.json_string(report))["suites"][0]["name"] == "perf"


def test_progress_names_the_engine_runs_going_on_while_nothing_else_is_printed():
    """A long engine run never looks like a hang: with nothing printed for `every` seconds,
    the progress says which runs are going and for how long; its thread stops on exit."""
    import io
    import sys
    from epmci.contract.process import EngineCommand, run_engine
    out = io.StringIO()
    engine = EngineCommand((sys.executable, "-c", "import time; time.sleep(1.2)"), False)
    with rep.ConsoleProgress(out, every=0.3) as progress:
        run = run_engine(engine, [], timeout=30, label="model teacher-forced")
        progress.note("done")
    assert run.ok
    lines = out.getvalue().splitlines()
    beats = [l for l in lines if "... running: model teacher-forced (" in l]
    assert beats and lines[-1] == "done", lines
    assert not progress._thread.is_alive()


def plot_report() -> CheckReport:
    r = CheckReport(suites=[SuiteInfo("model", "model"), SuiteInfo("perf", "perf")], meta={})
    r.results = [
        CheckResult("model", "prompt positions", "fail", "positions 0..9 differ", {
            "mode": "kl", "max_kl_allowed": 0.01, "prompt_kl": [1e-4] * 5 + [0.05] * 5, "decode_kl": [0.02, 0.03],
            "prompt_first_differing_position": 5, "teacher_forced": True}, order=1),
        CheckResult("perf", "base: tok/s", "pass", "SAME", {
            "pair_ratios": [0.99, 1.01, 1.0, 1.02, 0.98, 1.0], "ci_low": 0.985, "ci_high": 1.012,
            "min_effect": 0.05, "verdict": "SAME"}, order=2),
    ]
    return r


def test_plots_are_drawn_next_to_the_reports_and_linked(tmp_path):
    pytest.importorskip("matplotlib")          # a [test] dependency; the no-matplotlib path is the next test
    report = plot_report()
    plots, note = rep.write_plots(report, tmp_path)
    assert note is None and sorted(p.name for p in plots) == ["model-prompt-positions.svg", "perf-base--tok-s.svg"]
    assert all(p.read_text().lstrip().startswith("<?xml") and "<svg" in p.read_text() for p in plots)
    report.meta["plots"] = [str(p) for p in plots]
    assert "[model-prompt-positions.svg](model-prompt-positions.svg)" in rep.markdown(report)


def test_without_matplotlib_no_plots_and_the_summary_says_why(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import matplotlib raises ImportError
    report = plot_report()
    plots, note = rep.write_plots(report, tmp_path)
    assert plots == [] and "matplotlib is not installed" in note and not list(tmp_path.iterdir())
    report.meta["plots_note"] = note
    assert "epmci[plots]" in rep.markdown(report)


PREFILL = {"phase": "prefill", "tokens": 3, "seconds": 0.5, "hits": 2}


@pytest.mark.parametrize("records, says", [
    ([PREFILL | {"tokens": "3"}], 'line 1 (prefill): tokens is "3", not a number'),
    ([PREFILL | {"hits": True}], "hits is true, not a number"),
    ([PREFILL | {"hits": 2.5}], "hits is 2.5, not a whole number"),
    ([PREFILL | {"seconds": -1.0}], "seconds is -1.0, not a finite number >= 0"),
    ([PREFILL, PREFILL | {"phase": "decode", "hits": [1]}], "line 2 (decode): hits is [1], not a number"),
    ([PREFILL, PREFILL | {"phase": "decode"}, PREFILL | {"phase": "decode"}], "line 3: a second decode record"),
    ([PREFILL | {"phase": "decode"}], "no prefill record first (phases: decode)"),
    ([PREFILL | {"phase": "decode"}, PREFILL], "no prefill record first (phases: decode, prefill)"),
    ([PREFILL | {"phase": "warmup"}], "phase 'warmup' is none of prefill, decode"),
])
def test_malformed_stats_are_a_failure_naming_line_field_and_value(tmp_path, records, says):
    p = tmp_path / "stats.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ContractError) as e:
        read_stats(p)
    assert says in str(e.value)


def test_non_finite_stats_values_are_refused(tmp_path):
    p = tmp_path / "stats.jsonl"
    for bad in ("NaN", "Infinity"):
        p.write_text('{"phase": "prefill", "tokens": 3, "seconds": %s}\n' % bad)
        with pytest.raises(ContractError, match="seconds is .*not a finite number"):
            read_stats(p)
    p.write_text("[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(ContractError, match="line 1"):
        read_stats(p)
