"""The engine's import rules: it never imports the gate (epmci is what checks it), and a
`--no-pager` run does not load the paging machinery it does not use."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import engine

ENGINE_DIR = Path(engine.__file__).parent


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_engine_never_imports_epmci():
    files = sorted(ENGINE_DIR.rglob("*.py"))
    assert len(files) > 10, files
    bad = {str(p.relative_to(ENGINE_DIR)): sorted(m for m in imported_modules(p) if m.split(".")[0] == "epmci")
           for p in files}
    assert not {k: v for k, v in bad.items() if v}


def test_no_pager_run_does_not_import_the_pager(tiny_model):
    code = ("import sys\n"
            "from engine.runtime import Engine, Options\n"
            f"eng = Engine({str(tiny_model)!r}, Options(n_ctx=32, pager=False))\n"
            "eng.eval([1, 2, 3]); eng.close()\n"
            "print(sorted(m for m in sys.modules if m.startswith('engine.paging')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    loaded = r.stdout.strip().splitlines()[-1]
    assert "engine.paging.pager" not in loaded and "engine.paging.expert_io" not in loaded, loaded
    assert "engine.paging.config" in loaded, loaded   # (Options.pager_config): the listing works


OPENMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def _openmp_env_after_import(**env_vars) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_VARS}
    code = "import os, json, engine; print(json.dumps({k: os.environ.get(k) for k in %r}))" % (OPENMP_VARS,)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**env, **env_vars})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_openmp_threads_spin_briefly_unless_the_user_sets_a_wait_policy():
    """The engine bounds the OpenMP spin between parallel regions (engine/__init__.py):
    set before numba's runtime loads, for GNU's and Intel's/LLVM's runtimes; a wait policy
    or spin count the user gives is left alone."""
    assert _openmp_env_after_import() == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "2000", "KMP_BLOCKTIME": "0"}
    assert _openmp_env_after_import(OMP_WAIT_POLICY="PASSIVE") == {
        "OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None, "KMP_BLOCKTIME": None}
    assert _openmp_env_after_import(GOMP_SPINCOUNT="7")["GOMP_SPINCOUNT"] == "7"
