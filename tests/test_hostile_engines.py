"""Engines that misbehave on purpose (small stub engines, tests/test_hostile_engines.py's
HOSTILE): whatever a run does, the check ends within its limits, epmci's memory stays
bounded, nothing the engine started is left running, and each run is a failure with a
one-line reason naming the limit or the defect -- never a pass, never a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from faults import results, run_check

DECLARATION = {"contract": 2, "engine": {"name": "hostile", "version": "0"}, "architectures": ["qwen3moe"],
               "quant_types": ["F32", "Q8_0", "Q4_K", "Q5_K", "Q6_K"], "features": []}
# the seconds a stub's child sleeps: how the test finds one left running; this worker's own
# (its pid), so a parallel worker's child of the moment is never taken for a leftover
MARK = f"317.{os.getpid()}"

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
    "double-forks a daemon into a new session": (f"""
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{MARK}"])
            os._exit(0)
        os.wait()
    """, "left 1 process(es) of its own running (killed)"),
    "never exits": ("""
        import time
        time.sleep(600)
    """, "engine timed out after 3 s (killed)"),
    "exits 0 having written nothing": ("", "missing (the engine did not write it)"),
    "fills the disk of its output directory": ("""
        import os, time
        out = os.path.dirname(sys.argv[sys.argv.index("--stats-file") + 1])
        with open(os.path.join(out, "fill.bin"), "wb") as f:
            for _ in range(256):
                f.write(b"z" * (1 << 20))
                f.flush()
        time.sleep(60)
    """, "put more than 16 MiB in its output directory (engine.max_disk_mb)"),
}


def stub_engine(tmp_path, body: str) -> str:
    script = tmp_path / "hostile_engine.py"
    script.write_text("import json, sys\n"
                      f"if '--contract-info' in sys.argv:\n    print(json.dumps({DECLARATION!r}))\n    sys.exit(0)\n"
                      + textwrap.dedent(body))
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def left_running() -> list[str]:
    """This worker's marked processes still alive. A process epmci has just sent SIGKILL may
    show in ps for a moment until the kernel has torn it down (a suite at full load saw one):
    it is given 2 s to go; a zombie is already dead."""
    deadline = time.monotonic() + 2.0
    while True:
        ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout.splitlines()
        alive = [p.split(None, 1)[1] for p in ps if MARK in p and "ps -eo" not in p and not p.lstrip().startswith("Z")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def assert_epmci_unharmed(maxrss_before_kib: int) -> None:
    """What every misbehaving engine leaves behind in epmci: at most 256 MiB more peak
    memory, and no process of its own still running."""
    grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss_before_kib) / 1024
    assert grew_mib < 256, f"epmci grew by {grew_mib:.0f} MiB"
    assert left_running() == []


@pytest.mark.parametrize("behaviour", list(HOSTILE))
def test_a_hostile_engine_fails_with_the_reason_and_leaves_nothing(tmp_path, tiny_model, behaviour):
    body, says = HOSTILE[behaviour]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rc, rep = run_check(tmp_path, tiny_model, stub_engine(tmp_path, body), "--suites", "determinism",
                        "--set", "engine.max_output_mb=8", "--set", "engine.max_disk_mb=16", "--set", "engine.timeout_s=3",
                        "--set", "determinism.threads_alt=[2]")
    assert rc == 1 and not rep.get("tool_error"), rep.get("tool_error")
    res = results(rep, "determinism")
    failed = [r for r in res if r["status"] == "fail"]
    assert failed and all(r["status"] in ("fail", "skip") for r in res), res
    assert all(says in r["message"] for r in failed), [r["message"] for r in failed]
    assert all("Traceback" not in r["message"] for r in failed)
    assert_epmci_unharmed(before)


# Engines that run and answer, then lie in their outputs: the bundled engine wrapped, its
# files rewritten after it exits (RUN: where it runs; `arg` finds a flag's value). Each is a failure naming the
# defect wherever the gate reads the file, never a pass and never epmci's own error.
WRAPPED = """
import os, subprocess
REAL = [sys.executable, "-m", "engine"]
if "--contract-info" in sys.argv:
    sys.exit(subprocess.run(REAL + ["--contract-info"]).returncode)
def arg(flag):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else None
env = dict(os.environ)
"""
LIARS = {
    "writes a count as a string": ("""
        RUN
        p = arg("--stats-file")
        recs = [json.loads(l) for l in open(p)]
        recs[0]["hits"] = str(recs[0]["hits"])
        open(p, "w").write("".join(json.dumps(r) + "\\n" for r in recs))
    """, "(prefill): hits is \"", "determinism"),
    "writes its decode record twice": ("""
        RUN
        p = arg("--stats-file")
        lines = open(p).read().splitlines()
        open(p, "a").write(lines[-1] + "\\n")
    """, "a second decode record", "determinism"),
    "leaves out its prefill record": ("""
        RUN
        p = arg("--stats-file")
        lines = open(p).read().splitlines()
        open(p, "w").write("\\n".join(lines[1:]) + "\\n")
    """, "no prefill record first", "determinism"),
    "writes a NaN logit": ("""
        RUN
        import numpy as np
        p = arg("--logits-out")
        if p:
            a = np.fromfile(p, dtype="<f4")
            a[-1] = np.nan
            a.tofile(p)
    """, "non-finite logit(s), the first at row", "model"),
    "writes logits rows of half the vocabulary": ("""
        RUN
        import numpy as np
        p = arg("--logits-out")
        if p:
            b = open(p, "rb").read()
            n = int(np.frombuffer(b[:4], "<i4")[0])
            open(p, "wb").write(np.array([n // 2], "<i4").tobytes() + b[4:4 + (len(b) - 4) // (2 * n) * 2 * n])
    """, "vocab", "model"),
    "truncates its logits": ("""
        RUN
        p = arg("--logits-out")
        if p:
            b = open(p, "rb").read()
            open(p, "wb").write(b[:-100])
    """, "not a whole number of rows", "model"),
    "declares prefetch_dump but writes none": ("""
        env.pop("SDQ_PREFETCH_DUMP", None)
        RUN
    """, "prefetch", "determinism"),
}


@pytest.mark.parametrize("behaviour", list(LIARS))
def test_an_engine_lying_in_its_outputs_fails_naming_the_defect(tmp_path, tiny_model, behaviour):
    body, says, suite = LIARS[behaviour]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    script = tmp_path / f"lying_engine_{MARK}.py"         # its process is found by the MARK if left running
    run = "r = subprocess.run(REAL + sys.argv[1:], env=env)"
    script.write_text("import json, sys\n" + textwrap.dedent(WRAPPED) + textwrap.dedent(body).replace("RUN", run)
                      + "\nsys.exit(r.returncode)\n")
    rc, rep = run_check(tmp_path, tiny_model, f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}",
                        "--suites", suite, "--set", "determinism.threads_alt=[2]")
    assert rc == 1 and not rep.get("tool_error"), rep.get("tool_error")
    res = results(rep, suite)
    failed = [r for r in res if r["status"] == "fail"]
    assert failed, res
    assert any(says in r["message"] for r in failed), [r["message"] for r in failed]
    assert all("Traceback" not in r["message"] for r in res)
    assert_epmci_unharmed(before)


def test_the_limits_are_settings_with_defaults_stated_in_the_report(tmp_path, tiny_model):
    from epmci.config.schema import CheckConfig
    from epmci.contract.process import MAX_DISK_MB, MAX_OUTPUT_MB
    assert CheckConfig().engine.max_output_mb == MAX_OUTPUT_MB == 64
    assert CheckConfig().engine.max_disk_mb == MAX_DISK_MB == 8192
    from epmci.cli import main as epmci_main
    assert epmci_main(["check", "--set", "engine.max_output_mb=0"]) == 2
    assert epmci_main(["check", "--set", "engine.max_disk_mb=-1"]) == 2
    rc, rep = run_check(tmp_path, tiny_model, None, "--suites", "contract", "--set", "engine.max_disk_mb=100")
    assert rc == 0, rep.get("tool_error")
    limits = rep["meta"]["limits"]
    assert limits["engine.max_output_mb"] == 64 and limits["engine.max_disk_mb"] == 100
    assert limits["engine.timeout_s"] > 0


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


@pytest.mark.parametrize("behaviour", ["floods stdout", "leaves a child running",
                                       "double-forks a daemon into a new session"])
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


def test_an_engine_the_oom_killer_ends_is_reported_as_out_of_memory(tmp_path, monkeypatch):
    """A run that dies of SIGKILL while the OOM killer's count rises in epmci's memory
    cgroups is 'killed: out of memory (cap N MiB)', not a crash; a SIGKILL with no OOM kill
    is still a crash."""
    import epmci.contract.process as P
    engine = P.EngineCommand((sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
                             False)
    kills = iter(range(100))
    monkeypatch.setattr(P, "oom_kills", lambda: next(kills))            # one more at every look
    monkeypatch.setattr(P, "cgroup_memory_limit_gib", lambda: 8.0)
    run = P.run_engine(engine, [], timeout=30)
    assert run.failure() == "engine killed: out of memory (cap 8,192 MiB)"
    started = P.start_engine(engine, [], tmp_path, timeout=30).finish(30)
    assert started.failure() == "engine killed: out of memory (cap 8,192 MiB)"
    monkeypatch.setattr(P, "oom_kills", lambda: 7)
    assert P.run_engine(engine, [], timeout=30).failure() == "engine crashed (SIGKILL)"


MEMORY_V1 = Path("/sys/fs/cgroup/memory")


def _can_make_a_memory_cgroup() -> bool:
    return os.access(MEMORY_V1, os.W_OK) and (MEMORY_V1 / "memory.limit_in_bytes").exists()


@contextlib.contextmanager
def memory_cgroup(name: str, limit_bytes: int):
    """A cgroup-v1 memory cgroup of this worker with the limit; removed afterwards (its
    processes gone, rmdir succeeds within a few seconds)."""
    cg = MEMORY_V1 / f"epmci-{name}-test-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(limit_bytes))
        yield cg
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@pytest.mark.skipif(not _can_make_a_memory_cgroup(), reason="needs a writable cgroup-v1 memory hierarchy (root)")
def test_a_real_oom_kill_inside_a_capped_cgroup_is_named(tmp_path):
    """epmci and its engine in a 256 MiB cgroup, the engine allocating 1 GiB: the kernel's
    OOM killer ends it, and the run says so with the cap."""
    with memory_cgroup("oom", 256 << 20) as cg:
        probe = textwrap.dedent("""
            import json, sys
            from epmci.contract.process import EngineCommand, run_engine
            hog = "b = bytearray(1 << 30)\\nfor i in range(0, len(b), 4096): b[i] = 1\\n"
            run = run_engine(EngineCommand((sys.executable, "-c", hog), False), [], timeout=120)
            print(json.dumps(run.failure()))
        """)
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                           preexec_fn=lambda: (cg / "cgroup.procs").write_text(str(os.getpid())))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.splitlines()[-1]) == "engine killed: out of memory (cap 256 MiB)"


@pytest.mark.skipif(not _can_make_a_memory_cgroup(), reason="needs a writable cgroup-v1 memory hierarchy (root)")
def test_inside_a_real_cap_the_gate_runs_no_more_engines_than_fit(tmp_path, tiny_model):
    """epmci check with --jobs 4 inside a 3 GiB cgroup: the pool is what the cap leaves
    (less epmci's reserve), where fewer than four runs fit (each is estimated at no less than
    RUNTIME_MIB from the model's facts). It never runs more at once than fit, no engine is
    OOM-killed, and the check passes."""
    from epmci.contract.memory import RUNTIME_MIB
    with memory_cgroup("pool", 3072 << 20) as cg:
        out = tmp_path / "report.json"
        r = subprocess.run([sys.executable, "-m", "epmci", "check", "--model", str(tiny_model), "-q",
                            "--suites", "switches", "--jobs", "4", "--json", str(out), "--no-build",
                            "--workdir", str(tmp_path / "work")],
                           capture_output=True, text=True, timeout=600,
                           preexec_fn=lambda: (cg / "cgroup.procs").write_text(str(os.getpid())))
        oom = (cg / "memory.oom_control").read_text()
        meta = json.loads(out.read_text())["meta"]
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "oom_kill 0" in oom, oom
        fit = max(1, int(meta["memory_mb"] // RUNTIME_MIB))
        assert meta["memory_mb"] < 3072 and fit < 4 and 1 <= meta["most_runs_at_once"] <= fit, meta


def test_a_started_engine_that_fills_its_output_directory_is_killed(tmp_path):
    """The paced runs' watcher also bounds the disk of the output directory (polled every
    second beside a timed engine)."""
    from epmci.contract.process import EngineCommand, start_engine
    script = tmp_path / "e.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        with open(sys.argv[1], "wb") as f:
            for _ in range(256):
                f.write(b"z" * (1 << 20))
                f.flush()
        time.sleep(60)
    """))
    engine = EngineCommand((sys.executable, str(script)), False, max_disk_mb=16)
    run = start_engine(engine, [str(tmp_path / "fill.bin")], tmp_path, timeout=60).finish(60)
    assert not run.ok and "put more than 16 MiB in its output directory (engine.max_disk_mb)" in run.failure()
    assert run.seconds < 30
