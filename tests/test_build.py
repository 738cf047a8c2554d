"""`epmci build`: the bundled engine's warm-up runs are engine runs like any other -- bounded
by the engine run timeout, their failure reported with the path that failed and the stderr
tail. The engines here are stand-in scripts in the bundled engine's place (nothing in the
engine knows about them)."""

from __future__ import annotations

import sys
import textwrap
import threading

from epmci.contract.build import build_engine
from epmci.contract.process import EngineCommand


def wrapped_bundled(tmp_path, body: str) -> EngineCommand:
    """A stand-in for the bundled engine's command: `body` decides what a run with `argv`
    does; every other run succeeds at once (no kernels compiled)."""
    script = tmp_path / "wrapper.py"
    script.write_text("import sys, time\nargv = sys.argv[1:]\n" + textwrap.dedent(body) + "\nsys.exit(0)\n")
    return EngineCommand((sys.executable, str(script)), True)


def build_in_thread(engine, model, tmp_path, run_timeout):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", build_engine(
        engine, model, 4.0, build_cmd=None, build_timeout=900.0, run_timeout=run_timeout, workdir=tmp_path)),
        daemon=True)
    t.start()
    t.join(120)          # liveness guard only: the run timeout below is 3 s
    assert not t.is_alive(), "build did not return: the warm-up run was not bounded by the run timeout"
    return out["r"]


def test_a_hung_warm_up_run_is_a_timeout_with_its_stderr_tail(tmp_path, tiny_model):
    engine = wrapped_bundled(tmp_path, """
        if "--no-pager" in argv:
            print("warming the resident path, then hanging", file=sys.stderr, flush=True)
            time.sleep(10**6)
    """)
    r = build_in_thread(engine, tiny_model, tmp_path, run_timeout=3.0)
    assert not r.ok
    assert "warm-up run (resident path) timed out after 3 s" in r.message
    assert "then hanging" in r.stderr_tail
    assert "--no-pager" in r.details


def test_a_failing_warm_up_run_names_its_path(tmp_path, tiny_model):
    engine = wrapped_bundled(tmp_path, """
        if "--selftest" in argv:
            print("epm-engine: error: selftest path broken", file=sys.stderr)
            sys.exit(3)
    """)
    r = build_in_thread(engine, tiny_model, tmp_path, run_timeout=300.0)
    assert not r.ok
    assert r.message.startswith("warm-up run (selftest path) failed (exit 3)")
    assert "selftest path broken" in r.message and "selftest path broken" in r.stderr_tail


def test_an_external_engine_without_a_build_command_has_nothing_to_build(tmp_path, tiny_model):
    r = build_engine(EngineCommand(("/nonexistent/engine",), False), tiny_model, 4.0, build_cmd=None,
                     build_timeout=1.0, run_timeout=1.0)
    assert r.ok and "nothing to build" in r.message


def test_an_external_build_command_is_bounded_by_the_build_timeout(tmp_path, tiny_model):
    r = build_engine(EngineCommand(("/nonexistent/engine",), False), tiny_model, 4.0,
                     build_cmd=[sys.executable, "-c", "import sys, time; print('compiling', file=sys.stderr, "
                                                      "flush=True); time.sleep(10**6)"],
                     build_timeout=2.0, run_timeout=300.0)
    assert not r.ok and r.message.startswith("build timed out after 2 s") and "compiling" in r.stderr_tail
