"""bench/shards.py record: --max-minutes ends a recording between runs and --resume goes on
where it stopped (no run twice, none left out); --cold-reference starts every check, and no
merge, without the reference's memoized forwards. The checks are stood in for by a fake
`epmci` process that writes a report and a memo entry, as a real check would."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import shards  # noqa: E402

from epmci.check.reference_runs import memo_dir  # noqa: E402


@pytest.fixture
def fake_epmci(tmp_path, monkeypatch):
    """Every `epmci ...` run: one minute of a fake clock; what it saw of the memo."""
    monkeypatch.setenv("EPMCI_CACHE_DIR", str(tmp_path / "cache"))
    clock, seen = [0.0], []
    monkeypatch.setattr(shards.time, "monotonic", lambda: clock[0])

    def run(cmd, **kw):
        argv = cmd[cmd.index("epmci") + 1:]
        seen.append((argv[0], argv[argv.index("--shard") + 1] if "--shard" in argv else None,
                     memo_dir().exists()))
        report = {"verdict": "PASS", "counts": {"pass": 1}, "meta": {},
                  "suites": [{"name": "model", "results": [{"name": "whole model", "status": "pass"}]}]}
        Path(argv[argv.index("--json") + 1]).write_text(json.dumps(report))
        if argv[0] == "check":                       # a check leaves its forward in the memo
            memo_dir().mkdir(parents=True, exist_ok=True)
            (memo_dir() / "forward.npz").write_bytes(b"x")
        clock[0] += 60.0
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(subprocess, "run", run)
    return seen


def record(tmp_path, *args):
    argv = ["shards.py", "record", "--model", "tiny", "--shards", "2", "--out", str(tmp_path / "rec.jsonl"),
            "--work", str(tmp_path / "work"), *args]
    sys_argv, sys.argv = sys.argv, argv
    try:
        return shards.main()
    finally:
        sys.argv = sys_argv


def runs(tmp_path):
    return [json.loads(line)["run"] for line in (tmp_path / "rec.jsonl").read_text().splitlines()]


def test_max_minutes_stops_between_runs_and_resume_goes_on(tmp_path, fake_epmci):
    assert record(tmp_path, "--max-minutes", "1.5") == 0          # whole (1 min), shard 1 (2 min): stop
    assert runs(tmp_path) == ["whole", "2 shards: 1/2"]
    assert record(tmp_path, "--max-minutes", "1.5", "--resume") == 0
    assert runs(tmp_path) == ["whole", "2 shards: 1/2", "2 shards: 2/2", "2 shards: merge"]
    assert [s[:2] for s in fake_epmci] == [("check", None), ("check", "1/2"), ("check", "2/2"), ("merge", None)]


def test_cold_reference_empties_the_memo_before_every_check(tmp_path, fake_epmci):
    assert record(tmp_path, "--cold-reference") == 0
    assert fake_epmci == [("check", None, False), ("check", "1/2", False), ("check", "2/2", False),
                          ("merge", None, True)]                  # a merge is not a check: memo as found
    recs = [json.loads(line) for line in (tmp_path / "rec.jsonl").read_text().splitlines()]
    assert [r["reference_cache"] for r in recs] == ["cold", "cold", "cold", "as found"]


def test_without_it_later_checks_find_the_memo(tmp_path, fake_epmci):
    assert record(tmp_path) == 0
    assert [s[2] for s in fake_epmci] == [False, True, True, True]


def test_a_max_minutes_of_zero_is_refused(tmp_path, fake_epmci, capsys):
    with pytest.raises(SystemExit) as e:
        record(tmp_path, "--max-minutes", "0")
    assert e.value.code == 2 and "--max-minutes must be > 0" in capsys.readouterr().err
    assert fake_epmci == [] and not (tmp_path / "rec.jsonl").exists()
