"""A check's engine outputs: removed after a pass, kept after a failure -- but of the failed
checks' outputs in one place only the newest --keep-failed stay, so a self-hosted runner's
disk does not fill with them; outputs kept on request, and a running check's, are never
removed."""

from __future__ import annotations

import json

import pytest

from epmci.check import runner, suites
from epmci.check.result import CheckResult
from epmci.check.suites.base import Task
from epmci.check.workdirs import KEPT_MARK, PREFIX, prune_failed
from epmci.cli import main as epmci_main
from epmci.config import load_config


class OneResult:
    """The perf suite's place in the registry, with one result of the status asked for."""
    name, title, description = "perf", "perf: a stand-in", "one result"

    def __init__(self, status: str):
        self.status = status

    def plan(self, ctx):
        return [Task("perf", "one", lambda: [CheckResult("perf", "one", self.status, self.status)], ["one"], cost=1)]


def check(monkeypatch, model, base, status, **kw):
    monkeypatch.setitem(suites.SUITES, "perf", OneResult(status))
    cfg = load_config(search=False, overrides={"model": str(model), "suites": ["perf"]})
    return runner.run_check(cfg, build=False, workdir=base, **kw)


def kept(base):
    return sorted(d.name for d in base.glob(PREFIX + "*"))


def test_only_the_newest_failed_outputs_stay(monkeypatch, tiny_model, tmp_path):
    base = tmp_path / "w"
    running = base / (PREFIX + "running")               # another check's, still going: no mark
    running.mkdir(parents=True)
    asked = check(monkeypatch, tiny_model, base, "pass", keep_work=True).meta["workdir"]
    failed = [check(monkeypatch, tiny_model, base, "fail", keep_failed=2) for _ in range(4)]
    assert all(r.exit_code == 1 and r.meta["workdir_kept"] for r in failed)
    # each failure removed what fell beyond the newest two, the oldest first
    assert [len(r.meta["workdirs_removed"]) for r in failed] == [0, 0, 1, 1]
    assert failed[3].meta["workdirs_removed"] == [failed[1].meta["workdir"]]
    names = {r.meta["workdir"].rsplit("/", 1)[-1] for r in failed[2:]}
    assert kept(base) == sorted(names | {running.name, asked.rsplit("/", 1)[-1]})
    assert json.loads((base / asked.rsplit("/", 1)[-1] / KEPT_MARK).read_text())["why"] == "asked"
    passed = check(monkeypatch, tiny_model, base, "pass")  # a pass leaves nothing and removes nothing
    assert "workdir_kept" not in passed.meta and len(kept(base)) == 4


def test_keep_failed_zero_keeps_no_failed_outputs(monkeypatch, tiny_model, tmp_path):
    first = check(monkeypatch, tiny_model, tmp_path, "fail", keep_failed=1)
    second = check(monkeypatch, tiny_model, tmp_path, "fail", keep_failed=0)
    assert first.meta["workdir_kept"] and "workdir_kept" not in second.meta
    assert second.meta["workdirs_removed"] == [first.meta["workdir"]] and kept(tmp_path) == []


def test_marks_that_are_not_epmci_s_are_left_alone(tmp_path):
    for name, mark in [("a", "not json"), ("b", '{"why": "failed"}'), ("c", '["failed"]')]:
        (tmp_path / (PREFIX + name)).mkdir()
        (tmp_path / (PREFIX + name) / KEPT_MARK).write_text(mark)
    assert prune_failed(tmp_path, 0) == [] and len(kept(tmp_path)) == 3


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_a_bad_keep_failed_is_exit_2(value, capsys):
    with pytest.raises(SystemExit) as e:
        epmci_main(["check", "--keep-failed", value])
    assert e.value.code == 2 and "--keep-failed" in capsys.readouterr().err
