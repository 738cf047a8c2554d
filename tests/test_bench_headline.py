"""bench/headline.py's Belady column: the decode hit rate of Belady's MIN on a paged run's own
lookups (from its MoE dump) with its slots is what no eviction policy beats -- at least the
hit rate of the engine's own LRU without prefetch on the same run, and the in-process trace's
MIN (bench/paging.py) to the digit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import headline  # noqa: E402
import paging  # noqa: E402

from epmci.contract.bundled import ARGV  # noqa: E402
from epmci.contract.outputs import ContractError, read_stats  # noqa: E402
from epmci.contract.runspec import STATS_FILE, RunSpec  # noqa: E402


def test_belady_from_the_dump_is_the_ceiling_of_lru_and_the_in_process_trace_s(ci_model, tmp_path):
    arena = 20.0   # MiB: about a sixth of the ci model's experts, so LRU misses often
    spec = RunSpec(headline.PROMPT, n_predict=12, threads=1, batch=8, ctx=headline.ENGINE_CTX, dump_logits=False,
                   arena_mb=arena, chat=False)
    r = subprocess.run([*ARGV, *spec.args(str(ci_model), tmp_path), "--no-prefetch"], capture_output=True, text=True,
                       env={**os.environ, "SDQ_MOE_DUMP": str(tmp_path / "moe")}, timeout=300)
    assert r.returncode == 0, r.stderr
    stats = read_stats(tmp_path / STATS_FILE)
    lru = {s["phase"]: s for s in stats}["decode"]["hit_rate"]
    best = headline.belady_hit_rate(str(ci_model), tmp_path / "moe", stats)
    assert lru < best <= 100.0, (lru, best)
    with pytest.raises(ContractError):   # headline.engine_run reports it, keeping the timed rounds
        headline.belady_hit_rate(str(ci_model), tmp_path / "no-such-dump", stats)

    # the same run in-process (bench/paging.py's run), its lookups taken from the pager itself
    run = paging.one_run(str(ci_model), arena, {"SDQ_PREFETCH": "0"}, 1, 12)
    assert run["decode"]["hit_rate"] == lru
    assert round(paging.belady_decode_hit_rate(run), 6) == round(best, 6)
