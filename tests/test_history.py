"""epmci history: a check report's measurements appended to the default branch's history,
and drift found by change-point detection (E-Divisive) -- a staircase of small slowdowns
that each pass a pull request's gate fails here, naming the commits; an unchanged series
does not."""

from __future__ import annotations

import json

import numpy as np
import pytest

from epmci.cli import main as epmci_main
from epmci.config.schema import PerfConfig
from epmci.errors import InputError
from epmci.perf.history import FORMAT, DriftRule, append, change_points, drift, entry_of_report, read_history

RULE = DriftRule.of(PerfConfig())
NOISE = 0.005     # an entry's relative sd (a paced ratio of 6 pairs: 0.47 % recorded, docs/perf-data/history-noise/)


RATIO = "decode_ratio_vs_base/baseline"


def report(tok_s: list[float], rss: float = 300.0, verdict: str = "PASS", ratio: float | None = None) -> dict:
    results = [{"name": "baseline: decode tok/s vs golden", "status": "pass", "properties": {"samples": tok_s}},
               {"name": "baseline: peak RSS", "status": "pass", "properties": {"peak_rss_mb": rss}},
               {"name": "baseline: counters", "status": "pass", "properties": {}}]
    if ratio is not None:
        results.append({"name": "baseline: decode tok/s vs base r0", "status": "pass",
                        "properties": {"mode": "paced", "ratio": ratio, "base_sha": "r0"}})
    return {"format": "epmci-check/1", "verdict": verdict, "started": "2026-12-07T01:00:00+0000",
            "meta": {"model": "/cache/ci-seed0-gen2.gguf", "profile": "epm-8gb", "machine": {"n_cpus": 2}},
            "suites": [{"name": "perf", "results": results}]}


def series(levels: list[float], seed: int = 0, metric: str = RATIO) -> list[dict]:
    """Entries of a metric at these levels, each with an entry's noise (NOISE)."""
    rng = np.random.default_rng(seed)
    return [{"format": FORMAT, "commit": f"{i:040x}", "rebaseline": False,
             "metrics": {metric: lv * (1 + NOISE * rng.standard_normal())}}
            for i, lv in enumerate(levels)]


def test_an_entry_holds_the_median_tok_s_and_peak_rss_per_scenario():
    e = entry_of_report(report([30.0, 31.0, 29.0, 30.5, 29.5], rss=312.5), "abc")
    assert e["metrics"] == {"decode_tok_s/baseline": 30.0, "peak_rss_mb/baseline": 312.5}
    assert (e["commit"], e["model"], e["profile"], e["format"]) == ("abc", "ci-seed0-gen2", "epm-8gb", FORMAT)


def test_a_paced_ratio_against_the_base_is_the_drift_signal_and_a_new_base_starts_it_anew():
    """The workflow runs main against its last golden re-recording: the paced head/base ratio
    is the drift since then, measured in one run. A report with only that ratio is an entry;
    the series restarts where the base changes."""
    rep = report([])
    rep["suites"][0]["results"].append({"name": "baseline: decode tok/s vs base abc123", "status": "pass",
                                        "properties": {"mode": "paced", "ratio": 0.9712, "base_sha": "abc123"}})
    e = entry_of_report(rep, "def")
    assert e["metrics"]["decode_ratio_vs_base/baseline"] == 0.9712 and e["base"] == "abc123"
    rng = np.random.default_rng(0)
    entries = [{"format": FORMAT, "commit": f"c{i}", "base": "old" if i < 12 else "new",
                "metrics": {"decode_ratio_vs_base/baseline": (1.0 if i < 6 else 0.95) * (1 + 0.004 * rng.standard_normal())
                            if i < 12 else 1 + 0.004 * rng.standard_normal()}} for i in range(20)]
    assert drift(entries[:12], RULE)[0].failed
    d = drift(entries, RULE)[0]
    assert d.start == 12 and not d.failed


def test_a_report_that_timed_nothing_is_refused():
    untimed = report([])
    with pytest.raises(InputError, match="timed no decode run"):
        entry_of_report(untimed, "abc")


def test_append_and_read_back(tmp_path):
    h = tmp_path / "h.jsonl"
    for i in range(3):
        append(h, entry_of_report(report([30.0 + i]), f"c{i}"))
    assert [e["commit"] for e in read_history(h)] == ["c0", "c1", "c2"]


@pytest.mark.parametrize("line, says", [
    ("not json", "line 2 is not JSON"),
    ('{"format": "other", "commit": "x", "metrics": {}}', "line 2 is not an epmci-history/1 entry"),
    ('{"format": "epmci-history/1", "commit": "x", "metrics": {"m": "fast"}}', "line 2: metric m is not a finite"),
    ('{"format": "epmci-history/1", "commit": "x", "metrics": {"m": NaN}}', "line 2: metric m is not a finite"),
])
def test_a_broken_history_is_one_line_naming_it_and_is_never_extended(tmp_path, line, says):
    h = tmp_path / "h.jsonl"
    append(h, entry_of_report(report([30.0]), "c0"))
    h.write_text(h.read_text() + line + "\n")
    before = h.read_bytes()
    with pytest.raises(InputError, match=says):
        read_history(h)
    with pytest.raises(InputError):
        append(h, entry_of_report(report([30.0]), "c1"))
    assert h.read_bytes() == before


def test_unchanged_series_rarely_have_a_change_point_and_never_drift():
    """50 unchanged commits: a change point in at most ~pvalue of the series (the permutation
    test's level; 3 % allowed for 200 draws), and never a failure."""
    verdicts = [drift(series([1.0] * 50, seed), RULE)[0] for seed in range(200)]
    assert sum(bool(d.change_points) for d in verdicts) <= 6
    assert not any(d.failed for d in verdicts)


def test_a_staircase_of_1_percent_steps_fails_naming_each_step():
    """Five 1 % slowdowns, four commits apart: each passes a per-PR gate; the history
    fails, and names the commits around the steps it found."""
    levels = [1.0] * 10 + [0.99 ** (1 + k // 4) for k in range(20)]
    d = drift(series(levels), RULE)[0]
    assert d.failed and d.total < 0.97
    assert d.steps and all(s.ratio < 1 for s in d.steps)
    found = {int(s.at, 16) for s in d.steps}
    assert found & {10, 14, 18, 22, 26}, found     # at the commits where a step happened
    assert "DRIFT" not in d.message and "worse by more than 3 %" in d.message
    assert f"{d.steps[0].before[:12]}..{d.steps[0].at[:12]}" in d.message


def test_a_gain_golden_does_not_know_is_a_proposal_to_re_record_it():
    """A 5 % faster engine since the rebaseline passes, and proposes re-recording golden
    (else a later 5 % slowdown back to the old level would never drift); a drift proposes
    fixing or accepting it; an unchanged series proposes nothing."""
    up = drift(series([1.0] * 10 + [1.05] * 10), RULE)[0]
    assert not up.failed and " % better since" in up.proposal and "re-record golden" in up.proposal
    assert up.steps[0].text(RATIO) in up.proposal
    down = drift(series([1.0] * 10 + [0.95] * 10), RULE)[0]
    assert down.failed and "worse" in down.proposal and "accept it by re-recording golden" in down.proposal
    assert drift(series([1.0] * 20), RULE)[0].proposal == ""
    tok_s = drift(series([1.0] * 10 + [1.2] * 10, metric="decode_tok_s/baseline"), RULE)[0]
    assert tok_s.proposal == ""        # not gated: too noisy to move golden on


def test_tok_s_of_the_timed_runs_is_charted_but_never_fails():
    """Decode tok/s of 16-token runs varies ~12 % run to run: its drift is reported, not gated."""
    d = drift(series([1.0] * 10 + [0.9] * 10, metric="decode_tok_s/baseline"), RULE)[0]
    assert d.change_points and not d.failed and "informational" in d.message


def test_drift_is_measured_from_the_last_rebaseline():
    levels = [1.0] * 10 + [0.95] * 10
    e = series(levels)
    assert drift(e, RULE)[0].failed
    e[12]["rebaseline"] = True          # golden re-recorded at the slower level: accepted
    d = drift(e, RULE)[0]
    assert not d.failed and d.start == 12


def test_peak_rss_drifts_upward():
    rng = np.random.default_rng(1)
    e = [{"format": FORMAT, "commit": f"c{i}", "metrics": {"peak_rss_mb/baseline": (300 if i < 12 else 330)
                                                          + rng.standard_normal()}} for i in range(24)]
    d = drift(e, RULE)[0]
    assert d.failed and d.total > 1.05


def test_change_points_are_reproducible_and_leave_numpy_s_generator_alone():
    v = [x["metrics"][RATIO] for x in series([1.0] * 10 + [0.95] * 10)]
    np.random.seed(123)
    expected_next = np.random.random()
    np.random.seed(123)
    assert change_points(v, RULE) == change_points(v, RULE) == [10]
    assert np.random.random() == expected_next


def test_cli_append_then_check(tmp_path, capsys):
    h = tmp_path / "h.jsonl"
    rep = tmp_path / "r.json"
    levels = [1.0] * 10 + [0.95] * 8
    for i, e in enumerate(series(levels)):
        rep.write_text(json.dumps(report([30.0], ratio=e["metrics"][RATIO])))
        assert epmci_main(["history", "append", str(rep), "--history", str(h), "--commit", e["commit"]]) == 0
    out = tmp_path / "d.json"
    assert epmci_main(["history", "check", "--history", str(h), "--json", str(out)]) == 1
    text = capsys.readouterr().out
    assert f"DRIFT {RATIO}" in text and "ok    peak_rss_mb/baseline" in text
    assert f"PROPOSE re-baseline: {RATIO} is" in text
    data = json.loads(out.read_text())
    assert data["entries"] == 18 and [m["failed"] for m in data["metrics"]] == [True, False, False]
    # the same history judged with a larger allowance passes
    assert epmci_main(["history", "check", "--history", str(h), "--set", "perf.drift_max=0.08"]) == 0


def test_cli_refuses_bad_input_with_exit_2(tmp_path, capsys):
    assert epmci_main(["history", "check", "--history", str(tmp_path / "none.jsonl")]) == 2
    (tmp_path / "r.json").write_text(json.dumps(report([])))
    assert epmci_main(["history", "append", str(tmp_path / "r.json"), "--history", str(tmp_path / "h"),
                       "--commit", "x"]) == 2
    err = capsys.readouterr().err
    assert "no such history" in err and "timed no decode run" in err and "Traceback" not in err
    assert not (tmp_path / "h").exists()
    assert epmci_main(["history", "check", "--history", str(tmp_path / "none.jsonl"),
                       "--set", "perf.drift_max=2"]) == 2


def test_a_step_within_the_series_own_noise_is_no_verdict():
    """A gated metric whose entries vary by 3 %: E-Divisive finds the 4.5 % step and the
    newest entries are more than 3 % worse, but their median cannot tell that from the
    series' noise -- no failure, and the message says why; the same step on a quiet series
    fails."""
    rng = np.random.default_rng(6)
    noisy = [{"format": FORMAT, "commit": f"c{i}", "metrics": {RATIO: (1.0 if i < 15 else 0.955)
                                                               * (1 + 0.03 * rng.standard_normal())}}
             for i in range(30)]
    d = drift(noisy, RULE)[0]
    assert d.change_points and 1 - d.total > RULE.max_drift      # what would fail without the noise bound
    assert not d.failed and d.noise > 1 - d.total and "within this series' noise" in d.message
    quiet = drift(series([1.0] * 15 + [0.955] * 15), RULE)[0]
    assert quiet.failed and quiet.noise < 0.01
