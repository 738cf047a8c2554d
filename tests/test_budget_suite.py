"""The budget suite: the engine refuses a budget below the need it reports, keeps one just
above it, and a broken copy that ignores the budget, underestimates its memory or refuses
with a traceback fails with a message that says so."""

from __future__ import annotations

import pytest

from faults import broken_engine, results, run_check, statuses

pytestmark = pytest.mark.usefixtures("built_engine")
BELOW, ABOVE = "refuses a budget below its need", "runs within a budget just above its need"
GROWTH = "memory does not grow with tokens"


def budget_check(tmp_path, tiny_model, patch: str | None):
    cmd = broken_engine(tmp_path, patch) if patch else None
    rc, rep = run_check(tmp_path, tiny_model, cmd, "--suites", "budget", *(() if patch else ("--no-build",)))
    return rc, statuses(rep, "budget"), {r["name"]: r for r in results(rep, "budget")}


def test_the_bundled_engine_keeps_its_budget_promise(tmp_path, tiny_model):
    rc, st, res = budget_check(tmp_path, tiny_model, None)
    assert rc == 0 and st == {BELOW: "pass", ABOVE: "pass", GROWTH: "pass"}, res
    p = res[ABOVE]["properties"]
    assert 0 < p["peak_rss_mb"] <= p["budget_mb"] and p["budget_mb"] > p["need_mb"] > res[BELOW]["properties"]["budget_mb"]


def test_an_engine_ignoring_the_budget_fails(tmp_path, tiny_model):
    rc, st, res = budget_check(tmp_path, tiny_model, """
        import engine.paging.config as C
        good = C.PagerConfig.from_env.__func__
        C.PagerConfig.from_env = classmethod(lambda cls, arena_mb=None, ram_budget_mb=None, **k: good(cls, arena_mb, None, **k))
    """)
    assert rc == 1 and st[BELOW] == "fail" and "it ignores the budget" in res[BELOW]["message"]


def test_an_engine_that_allocates_more_than_it_counts_fails(tmp_path, tiny_model):
    rc, st, res = budget_check(tmp_path, tiny_model, """
        import engine.runtime as R
        good = R.Engine.__init__
        def __init__(self, *a, **k):
            good(self, *a, **k)
            self.ballast = np.ones(48 << 18, dtype=np.float32)      # 48 MiB after the budget check
        R.Engine.__init__ = __init__
    """)
    assert rc == 1 and st == {BELOW: "pass", ABOVE: "fail", GROWTH: "pass"} and "over the budget" in res[ABOVE]["message"]


def test_a_refusal_that_is_not_one_line_fails(tmp_path, tiny_model):
    rc, st, res = budget_check(tmp_path, tiny_model, """
        import engine.paging.budget as B
        good = B.check
        def check(budget_mb, parts, named=None):
            try:
                good(budget_mb, parts, named)
            except Exception as e:
                print("budget report:", parts, file=sys.stderr)
                raise
        B.check = check
    """)
    assert rc == 1 and st[BELOW] == "fail" and "must be one line on stderr" in res[BELOW]["message"]


def need_moving_up(marker, stats_lie: bool) -> str:
    """A copy whose counted runtime is 6 MiB more from its second run on (what reclaimed
    file pages do to the first run's RSS); with stats_lie the stats keep the first run's
    need, so the engine refuses a budget above what it reports."""
    return f"""
        import os
        import engine.paging.budget as B
        import engine.paging.pager as P
        first = not os.path.exists({str(marker)!r})
        if "--contract-info" not in sys.argv:         # the first run that runs the model
            open({str(marker)!r}, "a").close()
        good = B.breakdown
        runtime = []                                  # every run counts the first run's RSS: it moves by 6 MiB only
        def breakdown(*a, **k):
            parts = good(*a, **k)
            if not runtime:
                if first:
                    open({str(marker)!r}, "w").write(str(parts["runtime"]))
                runtime.append(int(open({str(marker)!r}).read() or parts["runtime"]))
            parts["runtime"] = runtime[0] + (0 if first else 6 << 20)
            return parts
        B.breakdown = breakdown
        if {stats_lie!r} and not first:
            good_counters = P.Pager.counters
            def counters(self):
                c = good_counters(self)
                c["ram_need_mb"] = round(c["ram_need_mb"] - 6, 1)
                return c
            P.Pager.counters = counters
    """


def test_a_need_that_moves_between_runs_is_asked_again_not_failed(tmp_path, tiny_model):
    """The first run reports 6 MiB less than every later one needs: the budget 4 MiB above
    the first report is refused, the need is asked again, and a budget above that is kept."""
    rc, st, res = budget_check(tmp_path, tiny_model, need_moving_up(tmp_path / "ran", stats_lie=False))
    p = res[ABOVE]["properties"]
    assert rc == 0 and st[ABOVE] == "pass", res[ABOVE]["message"]
    assert p["need_mb"] == pytest.approx(p["need_first_mb"] + 6, abs=0.2) and p["budget_mb"] > p["need_mb"]


def test_an_engine_refusing_a_budget_above_the_need_it_reports_fails(tmp_path, tiny_model):
    rc, st, res = budget_check(tmp_path, tiny_model, need_moving_up(tmp_path / "ran", stats_lie=True))
    assert rc == 1 and st[ABOVE] == "fail" and "engine refused to run (exit 2)" in res[ABOVE]["message"]
