"""epmci.compare.stats: Mann-Whitney U against known values and against scipy (a test dependency), the
sign test, and the verdict rules of the unpaired and the paired comparison."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as st

from epmci.config.schema import PerfConfig

from epmci.compare.stats import (DIFFERENT, SAME, UNKNOWN, bootstrap_ci, compare_paired, compare_samples,
                         mann_whitney_u, sign_test_p, wilcoxon_signed_rank_p)


def test_mwu_known_values():
    # complete separation of 3 vs 3: U = 0, exact two-sided p = 2 / C(6, 3) = 0.1
    u, p = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert u == 0 and p == pytest.approx(0.1)
    # 4 vs 4 separated: p = 2 / 70
    u, p = mann_whitney_u([10, 11, 12, 13], [1, 2, 3, 4])
    assert u == 16 and p == pytest.approx(2 / 70)
    # identical samples: no evidence at all
    assert mann_whitney_u([5, 5, 5], [5, 5, 5]) == (4.5, 1.0)


def test_mwu_exact_distribution_with_ties():
    # ties: ranks [1.5, 1.5, 3.5, 3.5, 5]; brute force over the 10 splits of a (size 2)
    a, b = [1, 2], [1, 2, 3]
    u, p = mann_whitney_u(a, b)
    ranks = [1.5, 3.5, 1.5, 3.5, 5.0]
    from itertools import combinations
    us = [sum(ranks[i] for i in c) - 3 for c in combinations(range(5), 2)]
    assert u == pytest.approx(sum(ranks[:2]) - 3)
    assert p == pytest.approx(np.mean([abs(x - 3) >= abs(u - 3) - 1e-9 for x in us]))


@pytest.mark.parametrize("n1,n2,shift,decimals", [(3, 5, 1.5, None), (6, 9, 0.4, None), (5, 5, 0.0, None),
                                                   (30, 40, 0.5, 1), (60, 60, 0.2, 1)])
def test_mwu_matches_scipy(n1, n2, shift, decimals):
    rng = np.random.default_rng(n1 * 100 + n2)
    a, b = rng.normal(10, 1, n1), rng.normal(10 + shift, 1, n2)
    if decimals is not None:              # ties: the large-sample normal approximation
        a, b = np.round(a, decimals), np.round(b, decimals)
        ref = st.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic", use_continuity=True)
    else:
        ref = st.mannwhitneyu(a, b, alternative="two-sided", method="exact")
    u, p = mann_whitney_u(a, b)
    assert u == pytest.approx(ref.statistic)
    assert p == pytest.approx(ref.pvalue, rel=1e-9)


def test_sign_test():
    assert sign_test_p([1] * 6) == pytest.approx(2 / 64)
    assert sign_test_p([1] * 5) == pytest.approx(2 / 32)
    assert sign_test_p([1, -1] * 3) == 1.0
    assert sign_test_p([0, 0]) == 1.0                  # zeros carry no sign
    assert sign_test_p([1] * 9 + [-1]) == pytest.approx(2 * 11 / 1024)


def test_bootstrap_is_deterministic():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert bootstrap_ci(np.median, [x]) == bootstrap_ci(np.median, [x])
    lo, hi = bootstrap_ci(np.median, [x])
    assert 1.0 <= lo <= 3.0 <= hi <= 5.0


def test_compare_samples_verdicts():
    golden = [100, 101, 99, 100.5, 99.5]
    slow = compare_samples(golden, [80, 81, 79])              # 20% slower, clearly separated
    assert slow.verdict == DIFFERENT and slow.regressed and slow.ratio == pytest.approx(0.8)
    assert slow.p_value < 0.05 and slow.ci[1] < 1
    same = compare_samples(golden, [100.2, 99.8, 100.1, 99.9, 100.0])
    assert same.verdict == SAME and not same.regressed
    # a clear but tiny change is not DIFFERENT (min effect 5%)
    tiny = compare_samples(golden, [98.5, 98.4, 98.6, 98.5, 98.55])
    assert tiny.verdict != DIFFERENT
    # wild noise: cannot tell
    noisy = compare_samples(golden, [60, 140, 100])
    assert noisy.verdict == UNKNOWN


def test_compare_paired_verdicts():
    base = [10.0, 10.5, 9.5, 10.2, 9.8, 10.1]
    head = [b * 0.9 for b in base]
    c = compare_paired(base, head)
    assert c.verdict == DIFFERENT and c.ratio == pytest.approx(0.9) and c.p_value == pytest.approx(2 / 64)
    assert c.regressed
    same = compare_paired(base, [b * f for b, f in zip(base, (1.01, 0.99, 1.0, 1.005, 0.995, 1.0))])
    assert same.verdict == SAME
    # five pairs can never reach p < 0.05 (either test): at best UNKNOWN
    assert compare_paired(base[:5], head[:5]).verdict == UNKNOWN
    assert compare_paired(base[:5], head[:5], test="sign").verdict == UNKNOWN
    # the signed-rank test uses the magnitudes: one small reversal among large drops
    mixed = [0.85, 0.86, 0.84, 1.01, 0.83, 0.85, 0.86, 0.84]
    assert compare_paired([1.0] * 8, mixed, test="sign").verdict == UNKNOWN          # 7/8: p = 0.07
    assert compare_paired([1.0] * 8, mixed).verdict == DIFFERENT                     # p = 4/256
    with pytest.raises(ValueError):
        compare_paired([1.0], [1.0, 2.0])
    assert math.isfinite(c.ci[0]) and c.ci[0] <= c.ratio <= c.ci[1]


def test_wilcoxon_signed_rank_exact():
    assert wilcoxon_signed_rank_p([1] * 6) == pytest.approx(2 / 64)
    assert wilcoxon_signed_rank_p([0, 0, 0]) == 1.0
    # n = 3, ranks 1..3: W+ in {0..6} over 8 sign patterns; x = (-1, 2, 3): W+ = 5, |5-3| = 2:
    # patterns with W+ in {0, 1, 5, 6}: 4 of 8
    assert wilcoxon_signed_rank_p([-1, 2, 3]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        compare_paired([1.0], [1.0], test="t")


@pytest.mark.parametrize("n", [6, 9, 12, 20])
def test_wilcoxon_matches_scipy(n):
    x = np.random.default_rng(n).normal(0.1, 0.2, n)
    assert wilcoxon_signed_rank_p(x) == pytest.approx(st.wilcoxon(x, method="exact").pvalue, rel=1e-9)


def test_alpha_is_split_over_the_looks_of_a_sequential_comparison():
    from epmci.compare.stats import per_look_alpha, smallest_p
    # --perf-base defaults: verdicts at 8, 10 and 12 pairs
    assert per_look_alpha(0.05, 8, 12) == pytest.approx(0.05 / 3)
    assert per_look_alpha(0.05, 12, 12) == pytest.approx(0.05)
    assert per_look_alpha(0.05, 5, 9) == pytest.approx(0.05 / 3)      # golden timing: 5, 7, 9 runs
    assert per_look_alpha(0.05, 5, 8) == pytest.approx(0.05 / 3)      # 5, 7, 8: a partial last step is a look
    assert smallest_p(6) == pytest.approx(2 / 64) and smallest_p(8) == pytest.approx(2 / 256)
    # six pairs all slower by 10%: p = 2/64 is significant at 0.05 but not at 0.05 / 3 per look
    base = [10.0, 10.5, 9.5, 10.2, 9.8, 10.1]
    head = [b * 0.9 for b in base]
    assert compare_paired(base, head, alpha=0.05).verdict == DIFFERENT
    assert compare_paired(base, head, alpha=per_look_alpha(0.05, 6, 10)).verdict == UNKNOWN


def test_perf_base_pairs_that_can_never_reach_a_verdict_are_refused(tmp_path, capsys):
    from epmci.cli import main
    cfg = tmp_path / "epmci.yaml"
    cfg.write_text("model: tiny\nperf:\n  abba_pairs: 6\n  abba_max_pairs: 12\n")
    assert main(["check", "--config", str(cfg), "--no-build", "--suites", "perf"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(cfg) in err and "abba_pairs=6 can never give a verdict" in err and len(err.splitlines()) == 1


# ------------------------------------------------------------------ paced decisions

def test_student_t_matches_known_values_and_scipy():
    from epmci.compare.stats import student_t_cdf, student_t_ppf
    assert student_t_ppf(0.975, 5) == pytest.approx(2.570582, abs=1e-6)       # textbook table
    assert student_t_ppf(0.99, 10) == pytest.approx(2.763769, abs=1e-6)
    assert student_t_cdf(0.0, 3) == 0.5
    for t in (-1e-9, 0.3, -30.0):                                           # closed forms for df 1 and 2
        assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-15)
        assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-15)
    st = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 9, 30, 200):
        for t in (-30, -3, -0.5, 0.7, 2.5, 10):
            assert student_t_cdf(t, df) == pytest.approx(st.t.cdf(t, df), abs=1e-12)
        for q in (1e-6, 0.0025, 0.3, 0.9975):
            assert student_t_ppf(q, df) == pytest.approx(st.t.ppf(q, df), rel=1e-8)


def test_hodges_lehmann():
    from epmci.compare.stats import hodges_lehmann
    assert hodges_lehmann([1.0, 2.0, 3.0]) == 2.0
    # Walsh averages of (0, 0, 10): 0, 0, 10, 0, 5, 5 -> median 2.5; one outlier moves it less than the mean
    assert hodges_lehmann([0.0, 0.0, 10.0]) == 2.5
    assert hodges_lehmann([-1.0, 0.0, 1.0, 100.0]) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        hodges_lehmann([])


def gate_alpha_per_look() -> float:
    """The paced gate's own significance per look, from the default perf settings."""
    from epmci.compare.stats import per_look_alpha
    from epmci.config.schema import PerfConfig
    pc = PerfConfig()
    return per_look_alpha(pc.base_alpha, pc.base_pairs, pc.base_max_pairs, pc.base_more_pairs)


def paced_verdicts(effect: float, sd: float, n: int, trials: int, alpha: float | None = None, seed: int = 0):
    """Verdicts of compare_paced on `trials` synthetic decisions: n pair samples, log tok/s
    ratio normal(log(1 - effect), sd), at the gate's floor and minimum effect."""
    from epmci.compare.stats import compare_paced
    pc = PerfConfig()
    alpha = gate_alpha_per_look() if alpha is None else alpha
    rng = np.random.default_rng(seed)
    out = {"slower": 0, "faster": 0, SAME: 0, UNKNOWN: 0}
    for _ in range(trials):
        c = compare_paced(rng.normal(math.log(1 - effect), sd, n), alpha, pc.base_floor, pc.base_min_effect,
                          10.0, 10.0 * (1 - effect))
        key = ("slower" if c.ratio < 1 else "faster") if c.verdict == DIFFERENT else c.verdict
        out[key] += 1
    return out


def test_paced_rule_fails_a_change_at_the_floor_at_most_alpha_of_the_time():
    """A head exactly `floor` slower is where DIFFERENT starts: the upper bound is under 1 -
    floor at most alpha of the time, whatever the noise (measured at alpha 0.05, where the
    rate is visible); a smaller change fails less often, an unchanged head never."""
    floor = PerfConfig().base_floor
    for sd in (0.005, 0.02):
        v = paced_verdicts(floor, sd, 6, 4000, alpha=0.05)
        assert 0 < v["slower"] / 4000 < 0.05 * 1.25, v
    v = paced_verdicts(0.0, 0.01, 6, 2000)
    assert v["slower"] == 0 and v[SAME] > 1400


def test_paced_rule_detects_a_3_percent_slowdown_at_its_design_noise():
    """True 3 % slowdown: with 6 pairs of 0.5 % noise the first look calls it slower >= 95 %
    of the time; with 1.5 % noise it decides some at the first look and leaves the rest
    UNKNOWN (which buys pairs); never faster, and SAME no more often than the confidence
    bound may miss."""
    v = paced_verdicts(0.03, 0.005, 6, 1000)
    assert v["slower"] >= 950 and v[SAME] == 0 and v["faster"] == 0
    v = paced_verdicts(0.03, 0.015, 6, 1000)
    assert v["slower"] > 100 and v[UNKNOWN] > 300 and v["faster"] == 0
    assert v[SAME] <= 2 * gate_alpha_per_look() * 1000


def test_paced_rule_exact_cases():
    from epmci.compare.stats import compare_paced
    a = 0.01 / 4
    # every pair 10 % slower, tiny noise: DIFFERENT, regressed, bounds around 0.9
    c = compare_paced([math.log(0.9) + e for e in (0.001, -0.001, 0.0005, 0, -0.0005, 0.0002)], a, 0.0125, 0.03, 10, 9)
    assert c.verdict == DIFFERENT and c.regressed and c.ratio == pytest.approx(0.9, abs=1e-3)
    assert c.ci[0] < c.ratio < c.ci[1] and c.p_value < 1e-6 and c.n_current == 6
    # a clear 1 % slowdown is inside the 1.25 % floor: SAME (under the 3 % minimum effect), not DIFFERENT
    c = compare_paced([math.log(0.99) + e for e in (0.001, -0.001, 0.0005, 0, -0.0005, 0.0002)], a, 0.0125, 0.03, 10, 9.9)
    assert c.verdict == SAME and c.p_value > 0.5
    # 2 % slower with 2 % noise: can neither say more than 1.25 % slower nor rule out 3 %
    c = compare_paced([math.log(0.98) + e for e in (0.02, -0.02, 0.015, -0.015, 0.01, -0.01)], a, 0.0125, 0.03, 10, 9.8)
    assert c.verdict == UNKNOWN
    # clearly faster: DIFFERENT (a pass), not a regression
    c = compare_paced([math.log(1.2)] * 5 + [math.log(1.21)], a, 0.0125, 0.03, 10, 12)
    assert c.verdict == DIFFERENT and not c.regressed
    # identical pairs with no spread: no doubt
    c = compare_paced([math.log(0.9)] * 6, a, 0.0125, 0.03, 10, 9)
    assert c.verdict == DIFFERENT and c.p_value < 1e-12 and c.ci == (pytest.approx(0.9), pytest.approx(0.9))
    with pytest.raises(ValueError):
        compare_paced([0.1], a, 0.0125, 0.03, 1, 1)


def test_latency_percentiles_and_cpu_diagnosis():
    from epmci.compare.stats import cpu_diagnosis, latency_percentiles
    p = latency_percentiles(np.arange(1, 101) / 1000)
    assert p["p50"] == pytest.approx(0.0505) and p["p99"] == pytest.approx(0.09901) and list(p) == ["p50", "p95", "p99"]
    assert "waiting" in cpu_diagnosis(0.95, 1.0) and "waiting" in cpu_diagnosis(0.90, 0.97)
    assert "compute" in cpu_diagnosis(0.95, 0.95) and "compute" in cpu_diagnosis(1.05, 1.0)


# ------------------------------------------------------------------ the p99 verdict's tail test

def test_tail_test_exact_p_value_on_a_hand_made_case():
    from epmci.compare.stats import tail_test
    t = tail_test([1, 2, 3, 4], [5, 6, 7, 8], quantile=0.75)      # top 2 of 8 are both the head's
    assert (t.above, t.head_above) == (2, 2) and t.p_value == pytest.approx(6 / 28)   # C(4,2)/C(8,2)
    assert tail_test([5, 6, 7, 8], [1, 2, 3, 4], quantile=0.75).p_value == 1.0
    # identical step times (a coarse clock): ties go to the base, so no false alarm from them
    tie = tail_test([0.01] * 50, [0.01] * 50)
    assert tie.head_above == 0 and tie.p_value == 1.0


@pytest.mark.parametrize("noise", ["normal", "heavy"])
def test_tail_test_false_alarms_within_alpha_on_an_unchanged_head(noise):
    """2000 unchanged heads, 576 paced steps a side (the gate's 6 pairs x 96 steps), step times
    with normal jitter or a heavy (lognormal + rare 5x stalls) tail: the share with p < alpha
    stays within alpha (binomial 99.9 % upper margin), for the gate's alpha of 0.01."""
    from epmci.compare.stats import tail_test
    rng, alpha, n, trials = np.random.default_rng(7), 0.01, 576, 2000

    def steps():
        if noise == "normal":
            return 0.025 * (1 + 0.03 * rng.standard_normal(n))
        x = 0.025 * rng.lognormal(0, 0.1, n)
        return np.where(rng.random(n) < 0.01, 5 * x, x)
    alarms = sum(tail_test(steps(), steps()).p_value < alpha for _ in range(trials))
    assert alarms / trials <= alpha + 3.1 * math.sqrt(alpha * (1 - alpha) / trials), alarms


def test_tail_test_detects_a_heavier_tail_and_ignores_one_slow_step():
    """A head whose 5 % slowest steps take 2x (a real tail regression) is caught in >= 99 % of
    trials at the gate's alpha; one stalled step (the noise that used to fail an unchanged
    head) never is."""
    from epmci.compare.stats import tail_test
    rng, n = np.random.default_rng(11), 576
    caught = 0
    for _ in range(500):
        base = 0.025 * (1 + 0.03 * rng.standard_normal(n))
        head = 0.025 * (1 + 0.03 * rng.standard_normal(n))
        slow = rng.random(n) < 0.05
        head[slow] *= 2
        caught += tail_test(base, head).p_value < 0.01
    assert caught >= 495, caught
    base = 0.025 * (1 + 0.03 * rng.standard_normal(n))
    head = 0.025 * (1 + 0.03 * rng.standard_normal(n))
    head[17] = 1.0                                                    # one 40x stall
    assert tail_test(base, head).p_value > 0.05                      # no alarm: one step is one step
