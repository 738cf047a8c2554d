"""`epmci check` / `epmci build` end to end: exit codes 0/1/2, reports (JUnit valid against
the common XSD, JSON, Markdown step summary), the e2e comparison modes, config discovery."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path

import pytest
from lxml import etree

from epmci.cli import main as epmci_main

REPO = Path(__file__).resolve().parent.parent
XSD = Path(__file__).parent / "data" / "junit-10.xsd"


def validate_junit(path: Path) -> etree._Element:
    schema = etree.XMLSchema(etree.parse(str(XSD)))
    doc = etree.parse(str(path))
    assert schema.validate(doc), schema.error_log
    return doc.getroot()


def wrapper(tmp_path: Path, body: str, name: str = "engine_wrapper.py") -> str:
    p = tmp_path / name
    p.write_text("import sys, os\nimport numpy as np\nimport engine.cli\n" + textwrap.dedent(body)
                 + "\nsys.exit(engine.cli.main())\n")
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(p))}"


def check(tmp_path, *args) -> tuple[int, dict]:
    js = tmp_path / "r.json"
    rc = epmci_main(["check", "-q", "--json", str(js), "--workdir", str(tmp_path / "w"), *args])
    return rc, (json.loads(js.read_text()) if js.exists() else {})


def by_name(report: dict) -> dict[tuple[str, str], dict]:
    return {(s["name"], r["name"]): r for s in report["suites"] for r in s["results"]}


# ----------------------------------------------------------------- exit 0

@pytest.mark.long
def test_fast_check_passes_on_the_tiny_model(tmp_path, tiny_model, monkeypatch, capsys):
    """The whole gate (build included) on the bundled engine: exit 0, every report written."""
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "out" / "junit.xml"
    rc, rep = check(tmp_path, "--model", str(tiny_model), "--fast", "--junit-xml", str(junit))
    out = capsys.readouterr().out
    assert rc == 0, out
    assert rep["verdict"] == "PASS"
    names = by_name(rep)
    suites = {s for s, _ in names}
    assert suites == {"build", "kernel", "layer", "prefetch-stress", "determinism", "e2e", "model", "switches",
                      "budget", "perf"}
    assert names[("build", "bundled engine (numba kernels)")]["status"] == "pass"
    # every expert quant mix and size of the tiny model (Q5_K and Q6_K down), both ends
    pairs = {"L0 E0", "L0 E7", "L1 E0", "L1 E7", "L3 E0", "L3 E7"}       # each on the default and every path
    assert {n for s, n in names if s == "kernel"} == pairs | {f"{p} [{k}]" for p in pairs
                                                              for k in ("portable", "avx2", "avx512")}
    assert {n for s, n in names if s == "layer"} == {f"L{il}{k}" for il in range(4)
                                                     for k in ("", " [portable]", " [avx2]", " [avx512]")}
    stress = [r for (s, _), r in names.items() if s == "prefetch-stress"]
    assert {r["properties"]["layout"] for r in stress} == {"mixed", "uniform"}
    head = names[("prefetch-stress", "mixed run")]["properties"]
    assert head["evictions"] >= head["tokens"] and head["prefetch_issued"] > 0
    e2e = names[("e2e", "e2e A/B")]
    assert e2e["status"] == "skip" and "--fast" in e2e["message"]
    # no golden baseline ships for the tiny model: the perf comparisons are visible skips
    assert names[("perf", "baseline: counters")]["status"] == "skip"
    assert "epmci golden update" in names[("perf", "baseline: counters")]["message"]
    for (s, n), r in names.items():
        if s not in ("build", "e2e", "perf"):
            assert r["status"] == "pass", (s, n, r["message"])
    root = validate_junit(junit)
    assert root.get("failures") == "0" and root.get("errors") == "0"
    assert root.find(".//testcase[@name='e2e A/B']/skipped") is not None
    assert "## epmci check: PASS" in summary.read_text() and "skipped by --fast" in summary.read_text()
    n_pass = sum(r["status"] == "pass" for r in names.values())
    n_skip = sum(r["status"] == "skip" for r in names.values())
    assert summary.read_text().splitlines()[0].startswith(f"## epmci check: PASS ✅ -- {n_pass} checks passed, "
                                                          f"{n_skip} skipped (")
    assert "SKIP" in out and "epmci check: PASS" in out
    # every suite's wall time (those that ran engine tasks), in the report and the summaries
    assert set(rep["meta"]["suite_seconds"]) == suites - {"build", "e2e"} and all(t >= 0 for t in rep["meta"]["suite_seconds"].values())
    assert "per suite: " in out and "per suite: " in summary.read_text()
    assert rep["meta"]["memory_mb"] > 0 and rep["meta"]["most_runs_at_once"] >= 1   # run.memory_mb auto


def test_runs_that_do_not_fit_the_memory_together_run_one_at_a_time(tmp_path, tiny_model, built_engine):
    """run.memory_mb smaller than any run: two workers, yet one engine run at a time, and
    the check is still whole (the production model in an 8 GiB runner: two runs would be
    killed by the kernel)."""
    rc, rep = check(tmp_path, "--model", str(tiny_model), "--no-build", "--suites", "determinism,layer",
                    "--jobs", "2", "--set", "run.memory_mb=1")
    assert rc == 0, rep
    assert rep["meta"]["memory_mb"] == 1 and rep["meta"]["most_runs_at_once"] == 1
    assert [r["status"] for r in by_name(rep).values()] == ["pass"] * len(by_name(rep))


def test_a_perf_budget_larger_than_the_memory_for_runs_fails_up_front(tmp_path, tiny_model, built_engine):
    """perf.ram_budget_mb above what the check leaves for an engine run: every perf check
    fails at once with both numbers (in an 8 GiB runner the runs were killed minutes later)."""
    rc, rep = check(tmp_path, "--model", str(tiny_model), "--no-build", "--suites", "perf",
                    "--set", "run.memory_mb=300", "--set", "perf.ram_budget_mb=900")
    assert rc == 1
    rs = list(by_name(rep).values())
    assert rs and all(r["status"] == "fail" for r in rs)
    assert all("perf.ram_budget_mb 900 MiB is more than" in r["message"] and "(300 MiB" in r["message"] for r in rs)


def test_e2e_bundled_engine_is_byte_exact(tmp_path, tiny_model, built_engine):
    rc, rep = check(tmp_path, "--model", str(tiny_model), "--no-build", "--suites", "e2e",
                    "--set", "prompts.e2e=[a, Hello world]", "--set", "e2e.compare=kl")
    assert rc == 0, rep
    rs = [r for (s, _), r in by_name(rep).items() if s == "e2e"]
    assert [r["status"] for r in rs] == ["pass", "pass"]
    assert rs[0]["properties"]["prompt_tokens"] == 1          # a single-token prompt
    assert all(r["properties"]["mode"] == "exact" for r in rs)  # it declares reference_exact: always exact
    assert all(r["properties"]["identical"] and r["properties"]["text_equal"] for r in rs)


def test_e2e_modes_for_an_external_engine(tmp_path, tiny_model, built_engine):
    """Paged logits nudged by 1e-4: held to its reference_exact declaration it fails; without
    the declaration, kl within 1e-3 passes (argmax: unit-tested)."""
    cmd = wrapper(tmp_path, """
        import engine.runtime as R
        good = R.Engine.eval
        def eval_(self, tokens, phase="prefill", *rest):
            out = good(self, tokens, phase, *rest)
            return out + np.float32(1e-4) if self.options.pager else out
        R.Engine.eval = eval_
    """)
    base = ["--model", str(tiny_model), "--engine-cmd", cmd, "--suites", "e2e", "--set", "prompts.e2e=[a]",
            "--set", "e2e.n_predict=2"]
    rc, rep = check(tmp_path, *base)
    assert rc == 1
    (r,) = [r for (s, _), r in by_name(rep).items() if s == "e2e"]
    assert r["properties"]["mode"] == "exact" and "paged differs from --no-pager (exact)" in r["message"]
    rc, rep = check(tmp_path, *base, "--set", "e2e.compare=kl", "--set", "e2e.max_kl=1e-3",
                    "--set", "engine.features=[pager, moe_dump]")
    assert rc == 0, rep
    (r,) = [r for (s, _), r in by_name(rep).items() if s == "e2e"]
    assert r["properties"]["mode"] == "kl" and r["status"] == "pass"
    assert 0 < r["properties"]["max_kl"] <= 1e-3 and r["properties"]["argmax_agree"] == r["properties"]["rows"]


# ----------------------------------------------------------------- exit 1 with a JUnit record

def test_failure_junit_has_message_numbers_and_stderr(tmp_path, tiny_model, built_engine):
    cmd = wrapper(tmp_path, """
        if "--contract-info" not in sys.argv:     # it says what it is, then crashes on every run
            print("boom: the kernel cache is corrupt", file=sys.stderr)
            sys.exit(3)
    """)
    junit = tmp_path / "j.xml"
    rc, rep = check(tmp_path, "--model", str(tiny_model), "--engine-cmd", cmd, "--suites", "kernel",
                    "--set", "kernel.pairs=[[0, 0]]", "--junit-xml", str(junit))
    assert rc == 1
    root = validate_junit(junit)
    tc = root.find(".//testcase[@name='L0 E0']")
    assert "engine crashed (exit 3)" in tc.find("failure").get("message")
    assert "kernel cache is corrupt" in tc.find("system-err").text
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["L0 E0.returncode"] == "3" and props["L0 E0.status"] == "fail"


# ----------------------------------------------------------------- exit 2

def test_missing_model_is_exit_2(tmp_path, capsys):
    junit = tmp_path / "j.xml"
    rc, rep = check(tmp_path, "--model", str(tmp_path / "nope.gguf"), "--junit-xml", str(junit))
    assert rc == 2
    assert "no such model file" in capsys.readouterr().err
    assert rep["exit_code"] == 2 and rep["tool_error"]
    validate_junit(junit)


def test_not_a_model_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a GGUF file at all")
    rc, _ = check(tmp_path, "--model", str(bad))
    assert rc == 2 and "bad magic" in capsys.readouterr().err


def test_bad_config_is_exit_2(tmp_path, capsys):
    cfg = tmp_path / "epmci.yaml"
    cfg.write_text("engine:\n  timeout_s: soon\n")
    assert epmci_main(["check", "--config", str(cfg)]) == 2
    assert "engine.timeout_s must be a number of seconds > 0 or auto, got 'soon'" in capsys.readouterr().err
    assert epmci_main(["check", "--set", "layer.layers=[0, x]"]) == 2
    for bad in ("[1]", "[]", "[2, 0]", "often"):              # 1 is engine.threads: nothing to compare
        capsys.readouterr()
        assert epmci_main(["check", "--set", f"determinism.threads_alt={bad}"]) == 2
        assert "determinism.threads_alt must be 'auto'" in capsys.readouterr().err
    for key, bad in (("switches.queue", "0"), ("switches.queue", "many"), ("switches.queue_layer_ahead", "0")):
        capsys.readouterr()
        assert epmci_main(["check", "--set", f"{key}={bad}"]) == 2
        assert f"{key} must be 'auto' or a whole number >= 1" in capsys.readouterr().err
    assert epmci_main(["check", "--suites", "kernel,nosuch"]) == 2
    assert epmci_main(["check", "--layers", "0,one"]) == 2
    assert epmci_main(["check", "--config", str(tmp_path / "missing.yaml")]) == 2


def test_an_engine_that_fails_to_build_is_a_failing_engine_not_a_broken_gate(tmp_path, tiny_model, capsys):
    """A build that breaks is the engine's failure (exit 1, the compiler's message with it);
    a build command that cannot even be started is epmci unable to run (exit 2)."""
    build = (f"{shlex.quote(sys.executable)} -c \"import sys; "
             f"sys.stderr.write('kernels.c:12: error: expected ; before }}\\n'); sys.exit(1)\"")
    engine = f"{shlex.quote(sys.executable)} -m engine"
    junit = tmp_path / "j.xml"
    rc, rep = check(tmp_path, "--model", str(tiny_model), "--engine-cmd", engine, "--build-cmd", build,
                    "--junit-xml", str(junit))
    assert rc == 1 and not rep.get("tool_error")
    (r,) = [r for s in rep["suites"] for r in s["results"]]
    assert r["status"] == "fail" and r["message"].startswith("the engine failed before any check: build failed")
    assert "kernels.c:12: error: expected ;" in capsys.readouterr().out
    assert [s["name"] for s in rep["suites"]] == ["build"]       # no check ran
    validate_junit(junit)
    assert epmci_main(["build", "--model", str(tiny_model), "--engine-cmd", engine, "--build-cmd", build]) == 1
    assert "kernels.c:12" in capsys.readouterr().err
    rc, rep = check(tmp_path, "--model", str(tiny_model), "--engine-cmd", engine,
                    "--build-cmd", str(tmp_path / "no-such-build-script"))
    assert rc == 2 and "could not be started" in rep["tool_error"]


def test_build_bundled_engine_reports_seconds(tiny_model, capsys, built_engine):
    assert epmci_main(["build", "--model", str(tiny_model)]) == 0
    out = capsys.readouterr().out
    assert "built in" in out and " s" in out


# ----------------------------------------------------------------- defaults

def test_no_arguments_uses_the_repo_config_and_ci_model(tmp_path, monkeypatch, ci_model, built_engine):
    """From the repo root, `epmci check` finds epmci.yaml and the ci preset (one kernel pair
    here, to keep the test short)."""
    monkeypatch.chdir(REPO)
    js = tmp_path / "r.json"
    rc = epmci_main(["check", "-q", "--no-build", "--suites", "kernel", "--set", "kernel.pairs=[[7, 63]]",
                     "--set", "kernel.paths=[]", "--json", str(js)])
    rep = json.loads(js.read_text())
    assert rc == 0, rep
    assert rep["meta"]["config"] == str(REPO / "epmci.yaml")
    assert rep["meta"]["model"] == str(ci_model) and rep["meta"]["model_setting"] == "ci"
    (r,) = rep["suites"][0]["results"]
    assert r["name"] == "L7 E63" and r["properties"]["expert_types"] == "Q4_K/Q4_K/Q6_K"


def test_a_reader_that_goes_away_is_no_error(ci_model):
    """`epmci model info M | head -1`: no traceback when the pipe closes early."""
    import subprocess
    import sys
    p = subprocess.run(f"{sys.executable} -m epmci model info {ci_model} | head -1", shell=True,
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.stdout.strip() == str(ci_model) and p.stderr == "", p.stderr


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a reaper counts as gone)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.usefixtures("built_engine")
def test_a_stopped_check_leaves_no_engine_behind(tmp_path, tiny_model):
    """SIGTERM to `epmci check` (a cancelled CI job) kills its engine runs, which lead
    sessions of their own and would otherwise outlive it, and removes its work dir (a
    self-hosted runner's disk outlives the job); exit 128 + 15, one line saying so."""
    import signal
    import subprocess
    import time

    from faults import broken_engine
    pids = tmp_path / "engine.pids"
    cmd = broken_engine(tmp_path, f"""
        import os, engine.runtime as R
        def hang(self, *a, **k):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(600)
        R.Engine.__init__ = hang
    """)
    p = subprocess.Popen([sys.executable, "-m", "epmci", "check", "--model", str(tiny_model), "--engine-cmd", cmd,
                          "--suites", "layer,determinism", "--no-build", "-q", "--workdir", str(tmp_path / "w")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (pids.exists() and pids.read_text().strip()):
            time.sleep(0.2)
        assert pids.exists(), "no engine run started"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM
    assert "epmci: stopped by SIGTERM;" in err and "engine run(s) killed, 1 work dir(s) removed" in err
    assert (tmp_path / "w").is_dir() and list((tmp_path / "w").iterdir()) == []
    started = [int(x) for x in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_gone(pid) for pid in started):
        time.sleep(0.1)
    assert started and all(_gone(pid) for pid in started), started
