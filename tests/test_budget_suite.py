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
