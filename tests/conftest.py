"""Shared fixtures: the synthetic models, made once per machine into the model cache
(the cache's file lock makes parallel xdist workers wait rather than race), and the bundled
engine built once per test run."""

from __future__ import annotations

import fcntl
import tempfile
from pathlib import Path

import pytest

import epmci.perf.paced as paced_mod
from epmci.synth.store import make_model


def pytest_collection_modifyitems(items):
    """Tests marked `long` (a worker busy for 20 s or more) first: xdist hands tests out in
    collection order, and a long test handed out last leaves the other worker idle."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(autouse=True)
def outside_ci(monkeypatch):
    """Every test sees the same gate whether or not the suite itself runs in CI: a missing
    golden baseline fails `epmci check` when CI or GITHUB_ACTIONS is set. Tests of that rule
    set them themselves."""
    for v in ("CI", "GITHUB_ACTIONS"):
        monkeypatch.delenv(v, raising=False)


@pytest.fixture(scope="session")
def tiny_model():
    return make_model("tiny")


@pytest.fixture(scope="session")
def ci_model():
    return make_model("ci")


@pytest.fixture(scope="session")
def built_engine(tiny_model, tmp_path_factory):
    """Compile the bundled engine's kernels once (broken copies of the engine are external
    engines, which `epmci check` does not build); workers take turns on a lock."""
    from epmci.contract.build import build_engine
    from epmci.contract.process import EngineCommand
    with open(Path(tempfile.gettempdir()) / "epmci-test-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = build_engine(EngineCommand.from_setting(None), tiny_model, 4.0, build_cmd=None,
                         build_timeout=900.0, run_timeout=300.0, workdir=tmp_path_factory.mktemp("build"))
    assert r.ok, (r.message, r.stderr_tail)
    return r


@pytest.fixture(scope="session")
def tiny35_model():
    return make_model("tiny35")


@pytest.fixture(scope="session")
def ci35_model():
    return make_model("ci35")


@pytest.fixture
def synthetic_peaks(monkeypatch):
    """Synthetic memory figures for the paced comparison: its probes run for real but report
    peak RSS = `fake.resident` (1000 MiB) + the arena the engine reported (with `fake.shrinks = False`, the
    first probe's arena: an engine whose memory does not follow --arena-mb). Yields (the fake
    probe, the arenas the probes reported, in order)."""
    seen: list[float] = []
    real = paced_mod.probe

    def fake(side, model, spec, workdir, timeout):
        m = real(side, model, spec, workdir, timeout)
        a = float(m.decode("arena_mb"))
        seen.append(a)
        m.peak_rss_mb = fake.resident + (a if fake.shrinks else seen[0])
        return m
    fake.shrinks, fake.resident = True, 1000.0
    monkeypatch.setattr(paced_mod, "probe", fake)
    return fake, seen
