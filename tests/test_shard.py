"""`epmci check --shard K/N` and `epmci merge`: N machines' parts of one check make the
verdict, cases and counts of the unsharded check, and a set of reports that is not one
whole check never merges into a pass (check/shard.py, check/merge.py)."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest

from epmci.check.merge import merge
from epmci.check.shard import Shard, Unit, loads, partition
from epmci.cli import main as epmci_main
from epmci.errors import InputError
from faults import Q6K_TOO_LARGE, broken_engine
from test_check_cli import validate_junit

DATA = Path(__file__).resolve().parent / "data"
# the ci model's units and the seconds each took (`epmci check --fast --model ci`, this repo)
CI_UNITS = json.loads((DATA / "ci-unit-seconds.json").read_text())


def cases(report: dict) -> list[tuple[str, str, str]]:
    return [(s["name"], r["name"], r["status"]) for s in report["suites"] for r in s["results"]]


# suites of many tasks, and perf, which runs whole on the last shard (bench/shards.py: every suite, ci model)
SUITES = "kernel,switches,budget,perf"


def run_check(tmp_path: Path, name: str, *args: str) -> tuple[int, dict, Path]:
    js = tmp_path / f"{name}.json"
    rc = epmci_main(["check", "-q", "--fast", "--model", "tiny", "--allow-missing-baseline", "--json", str(js),
                     "--workdir", str(tmp_path / "w"), "--suites", SUITES, *args])
    return rc, json.loads(js.read_text()), js


@pytest.fixture(scope="module")
def unsharded(tiny_model, tmp_path_factory):
    rc, rep, path = run_check(tmp_path_factory.mktemp("whole"), "whole")
    assert rc == 0, rep.get("tool_error")
    return rep, path


# ------------------------------------------------------------------ the partition

def test_shard_spec_parses_and_refuses_nonsense():
    assert Shard.parse("2/3") == Shard(2, 3) and str(Shard.parse(" 1 / 1 ")) == "1/1"
    for bad in ("0/2", "3/2", "1", "a/b", "", "1/0"):
        with pytest.raises(InputError, match="K/N"):
            Shard.parse(bad)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_partition_is_disjoint_stable_and_balanced_by_recorded_durations(n):
    """Every unit in exactly one shard, the same on every call (and in any input order), the
    timed perf unit on the last shard, and the largest shard within 1.3x of the mean."""
    units = [Unit(k, 1.0, timed=(k == "perf"), together="x" if k == "perf" else "") for k in CI_UNITS]
    where = partition(units, n, CI_UNITS)
    assert set(where) == set(CI_UNITS) and set(where.values()) == set(range(1, n + 1))
    assert partition(list(reversed(units)), n, CI_UNITS) == where
    assert where["perf"] == n
    load = loads(units, where, n, CI_UNITS)
    assert sum(load) == pytest.approx(sum(CI_UNITS.values()))
    assert max(load) <= 1.3 * statistics.mean(load), load


def test_units_without_a_recorded_duration_are_estimated_at_the_known_rate():
    units = [Unit("a", 2.0), Unit("b", 2.0), Unit("c", 4.0)]
    # a and b took 10 s for 2 runs: c's 4 runs are estimated at 20 s, alone on its shard
    where = partition(units, 2, {"a": 10.0, "b": 10.0})
    assert where["c"] != where["a"] == where["b"]
    assert loads(units, where, 2, {"a": 10.0, "b": 10.0}) in ([20.0, 20.0],)


# ------------------------------------------------------------------ sharded == unsharded

@pytest.mark.long
@pytest.mark.parametrize("n", [1, 2, 3])
def test_merged_shards_give_the_unsharded_verdict_cases_and_counts(n, unsharded, tmp_path, capsys):
    whole, whole_path = unsharded
    paths = []
    for k in range(1, n + 1):
        rc, rep, path = run_check(tmp_path, f"s{k}", "--shard", f"{k}/{n}", "--durations", str(whole_path))
        assert rc == 0 and rep["meta"]["shard"]["index"] == k
        paths.append(str(path))
    assert "perf" in json.loads(Path(paths[-1]).read_text())["meta"]["shard"]["assigned"]
    out = tmp_path / "merged"
    assert epmci_main(["merge", *paths, "--json", str(out / "m.json"), "--junit-xml", str(out / "m.xml"),
                       "--markdown", str(out / "m.md")]) == 0
    merged = json.loads((out / "m.json").read_text())
    assert merged["verdict"] == whole["verdict"] == "PASS"
    assert cases(merged) == cases(whole) and merged["counts"] == whole["counts"]
    assert [s["index"] for s in merged["meta"]["shards"]] == list(range(1, n + 1))
    validate_junit(out / "m.xml")
    assert "PASS" in (out / "m.md").read_text()


@pytest.mark.long
def test_a_failing_engine_fails_the_merge_as_it_fails_the_shard(tmp_path, tiny_model):
    """A broken engine (Q6_K products 0.2 % too large on every kernel path) fails the shards
    that ran the broken parts, and the merged verdict with them: exit 1, the engine's
    failure, not the tool's."""
    engine = broken_engine(tmp_path, Q6K_TOO_LARGE)
    def failed(rep: dict) -> set[str]:
        return {r["name"] for s in rep["suites"] for r in s["results"] if r["status"] == "fail"}
    paths, shard_failures = [], set()
    for k in (1, 2):
        rc, rep, path = run_check(tmp_path, f"s{k}", "--shard", f"{k}/2", "--engine-cmd", engine)
        paths.append(str(path))
        shard_failures |= failed(rep)
    assert epmci_main(["merge", *paths, "--json", str(tmp_path / "m.json")]) == 1
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["verdict"] == "FAIL" and not merged["tool_error"]
    assert failed(merged) == shard_failures and len(shard_failures) >= 2


# ------------------------------------------------------------------ fail closed

def shard_report(index: int, count: int, units: list[str], assigned: list[str], *, commit="c1",
                 model="m1", settings="s1", tool_error=None, build="pass") -> dict:
    results = [{"name": u, "title": u, "counts": {}, "results": [
        {"suite": u, "name": "case", "status": "pass", "message": "", "properties": {}, "seconds": 1.0,
         "stderr_tail": "", "details": "", "order": 1000 * (units.index(u) + 1), "unit": u}]} for u in assigned]
    build_suite = {"name": "build", "title": "engine build", "counts": {}, "results": [
        {"suite": "build", "name": "engine", "status": build, "message": "built", "properties": {},
         "seconds": 2.0, "stderr_tail": "", "details": "", "order": 0, "unit": "build/engine"}]}
    return {"format": "epmci-check/1", "verdict": "PASS", "exit_code": 0, "tool_error": tool_error,
            "started": "2026-12-07T00:00:00+0000", "seconds": 3.0, "counts": {},
            "meta": {"identity": {"commit": commit, "model": model, "settings": settings},
                     "unit_seconds": {u: 1.0 for u in assigned},
                     "shard": {"index": index, "count": count, "units": units, "assigned": assigned}},
            "suites": [build_suite, *results]}


UNITS = ["kernel/a", "kernel/b", "layer/c"]


def good_pair() -> list[tuple[str, dict]]:
    return [("s1.json", shard_report(1, 2, UNITS, ["kernel/a", "layer/c"])),
            ("s2.json", shard_report(2, 2, UNITS, ["kernel/b"]))]


def test_a_whole_set_of_shards_merges_into_one_pass():
    m = merge(good_pair())
    assert m.exit_code == 0 and m.tool_error is None
    assert [(r.suite, r.name) for r in m.results][0] == ("build", "engine")
    assert sum(r.suite == "build" for r in m.results) == 1 and len(m.results) == 4
    assert m.seconds == 3.0 and m.meta["seconds_all_shards"] == 6.0


def broken(change) -> list[tuple[str, dict]]:
    pair = copy.deepcopy(good_pair())
    change(pair)
    return pair


@pytest.mark.parametrize("change, reason", [
    (lambda p: p.pop(1), "shard(s) 2/2 missing: 1 of 2 reports given"),
    (lambda p: p.append(("again.json", p[1][1])), "shard 2/2 given twice (s2.json and again.json)"),
    (lambda p: p[1][1]["meta"]["identity"].update(commit="c2"), "of another commit than shard 1"),
    (lambda p: p[1][1]["meta"]["identity"].update(model="m2"), "of another model than shard 1"),
    (lambda p: p[1][1]["meta"]["identity"].update(settings="s2"), "of another settings than shard 1"),
    (lambda p: p[1][1]["meta"]["shard"].update(units=UNITS + ["x/y"]), "planned other units than shard 1"),
    (lambda p: p[1][1]["meta"]["shard"].update(count=3), "shards of different splits"),
    (lambda p: p[1][1]["suites"].append(copy.deepcopy(p[0][1]["suites"][1])), "unit 'kernel/a' run twice"),
    (lambda p: p[1][1]["suites"].pop(1), "unit 'kernel/b' of shard 2 has no result"),
    (lambda p: p[0][1]["meta"]["shard"]["assigned"].remove("layer/c"), "unit 'layer/c' assigned to no shard"),
    (lambda p: p[1][1].update(tool_error="cannot read the model"), "shard 2/2 (s2.json) could not run"),
    (lambda p: p[1][1]["meta"].pop("shard") and p[1][1].update(tool_error="no model"), "could not run: no model"),
])
def test_a_set_that_is_not_one_whole_check_is_an_error_with_its_reason(change, reason):
    m = merge(broken(change))
    assert m.exit_code == 2 and m.verdict == "ERROR"
    assert reason in m.tool_error, m.tool_error


def test_a_build_that_broke_on_one_shard_fails_the_merge_naming_it():
    pair = good_pair()
    pair[1][1]["suites"][0]["results"][0]["status"] = "fail"
    m = merge(pair)
    build = [r for r in m.results if r.suite == "build"]
    assert m.exit_code == 1 and len(build) == 1 and build[0].status == "fail" and "(shard 2/2)" in build[0].message


def test_merge_refuses_files_that_are_not_shard_reports_in_one_line(tmp_path, capsys):
    whole = tmp_path / "whole.json"
    rep = shard_report(1, 1, UNITS, UNITS)
    rep["meta"].pop("shard")
    whole.write_text(json.dumps(rep))
    garbage = tmp_path / "g.json"
    garbage.write_text("{not json")
    out = tmp_path / "m.json"
    bad_index = tmp_path / "bad-index.json"
    rep = shard_report(3, 2, UNITS, UNITS)
    bad_index.write_text(json.dumps(rep))
    bad_units = tmp_path / "bad-units.json"
    rep = shard_report(1, 1, UNITS, UNITS)
    rep["meta"]["shard"]["assigned"] = "kernel/a"
    bad_units.write_text(json.dumps(rep))
    bad_meta = tmp_path / "bad-meta.json"
    rep = shard_report(1, 1, UNITS, UNITS)
    rep["meta"] = ["not", "an", "object"]
    bad_meta.write_text(json.dumps(rep))
    for args, problem in (([str(whole)], "not a shard report"), ([str(garbage)], "the shard report is not JSON"),
                          ([str(tmp_path / "none.json")], "cannot read the shard report"),
                          ([str(bad_index)], "says shard 3 of 2"), ([str(bad_units)], "must be lists of unit names"),
                          ([str(bad_meta)], "its meta is not an object")):
        capsys.readouterr()
        assert epmci_main(["merge", *args, "--json", str(out)]) == 2
        err = capsys.readouterr().err
        assert problem in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_merge_writes_its_reports_even_when_the_set_is_incomplete(tmp_path):
    """The pull request's JUnit says why (an error case), not nothing."""
    s1 = tmp_path / "s1.json"
    s1.write_text(json.dumps(good_pair()[0][1]))
    assert epmci_main(["merge", str(s1), "--json", str(tmp_path / "m.json"),
                       "--junit-xml", str(tmp_path / "m.xml")]) == 2
    assert "missing" in json.loads((tmp_path / "m.json").read_text())["tool_error"]
    assert "missing" in (tmp_path / "m.xml").read_text()
    validate_junit(tmp_path / "m.xml")


def test_check_refuses_bad_shard_options_in_one_line(tmp_path, capsys):
    bad = tmp_path / "d.json"
    bad.write_text(json.dumps({"meta": {}}))
    for args, problem in ((["--shard", "3/2"], "--shard: must be K/N"),
                          (["--durations", str(bad)], "--durations: balances shards"),
                          (["--shard", "1/2", "--durations", str(bad)], "has no meta.unit_seconds")):
        capsys.readouterr()
        assert epmci_main(["check", *args]) == 2
        assert problem in capsys.readouterr().err
