"""Engines that misbehave on purpose (small stub engines, tests/test_hostile_engines.py's
HOSTILE): whatever a run does, the check ends within its limits, epmci's memory stays
bounded, nothing the engine started is left running, and each run is a failure with a
one-line reason naming the limit or the defect -- never a pass, never a traceback."""

from __future__ import annotations

import json
import resource
import shlex
import subprocess
import sys
import textwrap

import pytest

from faults import results, run_check

DECLARATION = {"contract": 2, "engine": {"name": "hostile", "version": "0"}, "architectures": ["qwen3moe"],
               "quant_types": ["F32", "Q8_0", "Q4_K", "Q5_K", "Q6_K"], "features": []}
MARK = "317.5"            # the seconds a stub's child sleeps: how the test finds one left running

HOSTILE = {
    "floods stdout": ("""
        blk = b"x" * (1 << 20)
        for _ in range(2048):
            sys.stdout.buffer.write(blk)
    """, "wrote more than 8 MiB to stdout and stderr (engine.max_output_mb)"),
    "floods stderr": ("""
        for _ in range(1 << 20):
            sys.stderr.write("warning: " + "y" * 1000 + "\\n")
    """, "wrote more than 8 MiB to stdout and stderr (engine.max_output_mb)"),
    "leaves a child running": (f"""
        import subprocess
        subprocess.Popen(["sleep", "{MARK}"])
    """, "left 1 process(es) of its own running (killed)"),
    "leaves a child that ignores SIGTERM, in its own process group": (f"""
        import os, subprocess
        subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "time.sleep({MARK})"], preexec_fn=os.setpgrp)
    """, "left 1 process(es) of its own running (killed)"),
    "never exits": ("""
        import time
        time.sleep(600)
    """, "engine timed out after 3 s (killed)"),
    "exits 0 having written nothing": ("", "missing (the engine did not write it)"),
}


def stub_engine(tmp_path, body: str) -> str:
    script = tmp_path / "hostile_engine.py"
    script.write_text("import json, sys\n"
                      f"if '--contract-info' in sys.argv:\n    print(json.dumps({DECLARATION!r}))\n    sys.exit(0)\n"
                      + textwrap.dedent(body))
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def left_running() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [p for p in ps if MARK in p and "ps -eo" not in p]


@pytest.mark.parametrize("behaviour", list(HOSTILE))
def test_a_hostile_engine_fails_with_the_reason_and_leaves_nothing(tmp_path, tiny_model, behaviour):
    body, says = HOSTILE[behaviour]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rc, rep = run_check(tmp_path, tiny_model, stub_engine(tmp_path, body), "--suites", "determinism",
                        "--set", "engine.max_output_mb=8", "--set", "engine.timeout_s=3",
                        "--set", "determinism.threads_alt=[2]")
    grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert rc == 1 and not rep.get("tool_error"), rep.get("tool_error")
    res = results(rep, "determinism")
    failed = [r for r in res if r["status"] == "fail"]
    assert failed and all(r["status"] in ("fail", "skip") for r in res), res
    assert all(says in r["message"] for r in failed), [r["message"] for r in failed]
    assert all("Traceback" not in r["message"] for r in failed)
    assert grew_mib < 256, f"epmci grew by {grew_mib:.0f} MiB"
    assert left_running() == []


def test_the_output_limit_is_a_setting_with_its_default_in_the_report(tmp_path, tiny_model):
    from epmci.config.schema import CheckConfig
    from epmci.contract.process import MAX_OUTPUT_MB
    assert CheckConfig().engine.max_output_mb == MAX_OUTPUT_MB == 64
    from epmci.cli import main as epmci_main
    assert epmci_main(["check", "--set", "engine.max_output_mb=0"]) == 2


def test_an_output_file_larger_than_any_run_writes_is_refused_unread(tmp_path):
    """A 3 GiB logits file (sparse: no disk used) is a failure naming its size, read from
    the file system's metadata, not into memory."""
    from epmci.contract.outputs import ContractError, read_logits
    big = tmp_path / "logits.bin"
    with open(big, "wb") as f:
        f.truncate(3 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ContractError, match=r"3.0 GiB, more than any output of a run can be"):
        read_logits(big)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) < 64 * 1024


@pytest.mark.parametrize("behaviour", ["floods stdout", "leaves a child running"])
def test_a_started_engine_is_held_to_the_same_limits(tmp_path, behaviour):
    """The paced runs' engines (start_engine: output to files, epmci talking to them over
    other descriptors) are bounded the same way: a flood is killed at the limit, a child
    left running fails the run and is killed."""
    from epmci.contract.process import EngineCommand, start_engine
    body, says = HOSTILE[behaviour]
    script = tmp_path / "e.py"
    script.write_text("import sys\n" + textwrap.dedent(body))
    engine = EngineCommand((sys.executable, str(script)), False, max_output_mb=8)
    run = start_engine(engine, [], tmp_path, timeout=60).finish(60)
    assert not run.ok and says in run.failure(), run.failure()
    assert (tmp_path / "engine.stdout").stat().st_size < (8 << 20) * 40     # killed long before 2 GiB
    assert left_running() == []
