"""The paced gate's error-rate estimator (epmci/perf/calibration.py) on synthetic pairs with a
known answer: replayed through the gate's own sequential decision, an unchanged head never
fails and a head 1 % slower fails within alpha, a 3 % slowdown at the measured per-pair
noise is caught, the Wilson interval covers what it should, and the drift check tells a
trend from none."""

from __future__ import annotations

import math

import numpy as np
import pytest

from epmci.config.schema import PerfConfig
from epmci.perf.calibration import drift, in_order, replay, replay_p99, wilson
from epmci.perf.paced import look_sizes, sequential_verdict

PC = PerfConfig()
GATE = dict(pairs=PC.base_pairs, step_pairs=PC.base_more_pairs, max_pairs=PC.base_max_pairs, alpha=PC.base_alpha,
            floor=PC.base_floor, min_effect=PC.base_min_effect)
NOISE = 0.0167      # the noisiest per-pair sd recorded (a slowed head beside a busy process, docs/PERF.md)


def recording(effect: float, noise: float, n: int = 400, seed: int = 0) -> list[float]:
    """Pair values (log head/base tok/s) of a head `effect` slower, per-pair noise sd `noise`."""
    return list(np.log1p(-effect) + noise * np.random.default_rng(seed).standard_normal(n))


def test_the_looks_are_the_gates():
    assert look_sizes(6, 6, 12) == [6, 12] and look_sizes(6, 4, 12) == [6, 10, 12] and look_sizes(8, 2, 8) == [8]
    assert look_sizes(PC.base_pairs, PC.base_more_pairs, PC.base_max_pairs) == [6, 12, 18, 24]


def test_an_unchanged_head_almost_never_fails_and_a_1_percent_slower_one_within_alpha():
    d = replay("unchanged", recording(0.0, NOISE), n=4000, rng=np.random.default_rng(1), **GATE)
    assert d.slower / d.n <= 0.001 and d.same / d.n > 0.99 and set(d.pairs_used) <= {6, 12, 18, 24}
    d = replay("slow1", recording(0.01, NOISE), n=4000, rng=np.random.default_rng(1), **GATE)
    share, lo, hi = d.rate(d.slower)
    assert share <= PC.base_alpha + 3 * math.sqrt(PC.base_alpha / d.n), (share, lo, hi)


def test_a_three_percent_slowdown_is_caught_at_the_measured_noise():
    d = replay("slow3", recording(0.03, NOISE, seed=2), n=2000, rng=np.random.default_rng(3), **GATE)
    assert d.slower / d.n >= 0.95 and d.same / d.n <= PC.base_alpha, d     # a true 3 % is at the SAME bound
    assert np.median(d.pairs_used) <= 12


def test_sequential_verdict_stops_at_the_first_decisive_look():
    same = [0.001, -0.002, 0.0, 0.001, -0.001, 0.0] * 2
    c, n = sequential_verdict(same, **GATE)
    assert c.verdict == "SAME" and n == 6
    with pytest.raises(ValueError):
        sequential_verdict(same[:3], **GATE)


def test_wilson_interval():
    lo, hi = wilson(0, 100)
    assert lo == 0.0 and 0.03 < hi < 0.04                 # the "rule of three" region
    lo, hi = wilson(50, 100)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(0.19, abs=0.01)


def test_drift_tells_a_trend_from_none():
    rng = np.random.default_rng(5)
    flat = list(rng.standard_normal(60))
    trend = [x + 0.1 * i for i, x in enumerate(flat)]
    assert drift(flat)[1] > 0.05 and drift(trend)[1] < 1e-4


def test_decisions_in_recording_order_use_each_pair_once():
    slow = in_order(recording(0.10, 0.005, n=20), **GATE)
    assert [(v, k) for v, _, k in slow] == [("slower", 6)] * 3          # 18 of 20 pairs, 2 too few for a look
    assert all(r == pytest.approx(0.90, abs=0.01) for _, r, _ in slow)
    same = in_order(recording(0.0, 0.005, n=13), **GATE)
    assert [(v, k) for v, _, k in same] == [("SAME", 6)] * 2
    # at the SAME/DIFFERENT boundary a decision may need its second look; with too few pairs
    # left for it, that decision is not counted
    edge = in_order(recording(0.05, 0.04, n=8, seed=5), **GATE)
    assert all(k in (6, 12) for _, _, k in edge) and sum(k for _, _, k in edge) <= 8


def step_times(n_pairs: int, slow_share: float, seed: int) -> list[tuple[list[float], list[float]]]:
    """(base, head) step times of n_pairs pairs x 96 steps: 3 % jitter and a heavy tail (1 %
    of steps up to 3x) on both sides; `slow_share` of the head's steps also 3x slower."""
    rng = np.random.default_rng(seed)

    def side(extra: float) -> list[float]:
        x = 0.5 * (1 + 0.03 * rng.standard_normal(96)) * np.where(rng.random(96) < 0.01, rng.uniform(1, 3, 96), 1)
        return list(x * np.where(rng.random(96) < extra, 3.0, 1.0))
    return [(side(0.0), side(slow_share)) for _ in range(n_pairs)]


def test_p99_verdicts_replayed_on_pairs_false_alarm_within_alpha_and_catch_a_heavier_tail():
    rng = np.random.default_rng(7)
    n = 1000
    unchanged = replay_p99(step_times(40, 0.0, 1), n=n, rng=rng, pairs=6, limit=PC.p99_max_ratio,
                           alpha=PC.base_alpha)
    assert unchanged / n <= PC.base_alpha + 3 * math.sqrt(PC.base_alpha / n), unchanged
    heavier = replay_p99(step_times(40, 0.05, 2), n=n, rng=rng, pairs=6, limit=PC.p99_max_ratio,
                         alpha=PC.base_alpha)
    assert heavier / n >= 0.95, heavier


def test_shorter_pairs_are_replayed_from_the_first_steps_of_longer_recordings():
    """bench/pairs.py analyse --steps N: a pair's value from its first N measured steps only
    (after its warm-up), and its seconds less the wall of the steps it no longer has."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from pairs import pair_seconds, pair_value
    # warm-up 1 step; measured: the head 10 % faster on the first 2 steps, then 10 % slower
    rec = {"warmup": 1, "seconds": 20.0, "base_wall": [9.0, 1.0, 1.0, 1.0, 1.0],
           "head_wall": [9.0, 1 / 1.1, 1 / 1.1, 1.1, 1.1]}
    assert pair_value(rec, steps=2) == pytest.approx(math.log(1.1))
    assert pair_value(rec, steps=None) == pytest.approx(0.0, abs=0.06)      # all 4: the HL of 2 up, 2 down
    assert pair_seconds(rec, steps=2) == pytest.approx(20.0 - 2.0 - 2.2)    # steps 3-4 of both sides cut
    assert pair_seconds(rec) == 20.0
