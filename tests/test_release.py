"""The installable release: a wheel and an sdist that build and pass `twine check`, and a
wheel that, installed into a fresh venv, runs `epmci check --fast` from a directory outside
the checkout and passes -- the bundled engine and its numba cache working from
site-packages, not from a source tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)


@pytest.mark.long
def test_the_wheel_installs_into_a_fresh_venv_and_gates_from_outside_the_checkout(tmp_path, ci_model):
    dist = tmp_path / "dist"
    r = run([sys.executable, "-m", "build", "--outdir", dist, ROOT], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    wheel, sdist = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheel) == 1 and len(sdist) == 1, list(dist.iterdir())
    r = run([sys.executable, "-m", "twine", "check", "--strict", *wheel, *sdist], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr

    # nothing of the checkout on the path: no PYTHONPATH (pip would take a source tree on it
    # for the installed distribution), the venv's own numba cache (next to the installed
    # engine); the model cache is shared
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR", "CI", "GITHUB_ACTIONS", "VIRTUAL_ENV")}
    env["EPMCI_CACHE_DIR"] = str(Path(ci_model).parent.parent)
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", venv], env=env, timeout=300).returncode == 0
    r = run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel[0]], env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    r = run([venv / "bin" / "epmci", "--version"], cwd=outside, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("epmci "), r.stdout + r.stderr
    junit = outside / "junit.xml"
    r = run([venv / "bin" / "epmci", "check", "--fast", "--junit-xml", junit, "-q"], cwd=outside, env=env,
            timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "config <defaults>" in r.stdout and "epmci check: PASS" in r.stdout
    site = run([venv / "bin" / "python", "-c", "import engine, epmci; print(engine.__file__, epmci.__file__)"],
               cwd=outside, env=env, timeout=60).stdout
    assert str(ROOT) not in site and "site-packages" in site, site
    assert list((Path(site.split()[0]).parent).rglob("*.nbi")), "numba cached the engine's kernels in site-packages"
