"""Noise-aware comparison of timing samples: Mann-Whitney U, bootstrap intervals, verdicts.

Shared runners are noisy, so a tok/s change is called only when it is both statistically
clear (p < alpha) and large enough to matter (|effect| >= min_effect). Everything here is
deterministic: bootstrap resampling uses a fixed seed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

SAME, DIFFERENT, UNKNOWN = "SAME", "DIFFERENT", "UNKNOWN"
EXACT_LIMIT = 20000  # enumerate the exact U distribution up to this many splits


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based), ties share the mean rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def mann_whitney_u(a, b) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test: (U of a, p-value).

    Exact permutation distribution of the rank sum when small enough (ties included,
    since the ranks are permuted as they are), else the normal approximation with tie
    correction and continuity correction.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney U needs samples on both sides")
    ranks = _ranks(np.concatenate([a, b]))
    r1 = ranks[:n1].sum()
    u1 = r1 - n1 * (n1 + 1) / 2.0
    mu = n1 * n2 / 2.0
    if math.comb(n1 + n2, n1) <= EXACT_LIMIT:
        sums = np.array([ranks[list(c)].sum() for c in combinations(range(n1 + n2), n1)])
        us = sums - n1 * (n1 + 1) / 2.0
        dev = abs(u1 - mu)
        p = float(np.mean(np.abs(us - mu) >= dev - 1e-9))
        return float(u1), min(1.0, p)
    _, counts = np.unique(ranks, return_counts=True)
    n = n1 + n2
    tie = (counts**3 - counts).sum() / (n * (n - 1))
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie))
    if sigma == 0:
        return float(u1), 1.0
    z = (abs(u1 - mu) - 0.5) / sigma
    p = math.erfc(max(z, 0.0) / math.sqrt(2.0))
    return float(u1), min(1.0, p)


def bootstrap_ci(stat, samples: list[np.ndarray], level: float = 0.95, n_boot: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of stat(*resampled samples)."""
    rng = np.random.default_rng(seed)
    vals = np.empty(n_boot)
    for i in range(n_boot):
        vals[i] = stat(*(s[rng.integers(0, len(s), len(s))] for s in samples))
    lo, hi = np.quantile(vals, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


@dataclass
class Comparison:
    verdict: str          # SAME | DIFFERENT | UNKNOWN
    baseline: float       # median of the baseline samples
    current: float        # median of the current samples
    ratio: float          # current / baseline
    p_value: float
    ci: tuple[float, float]  # interval of the ratio
    n_baseline: int
    n_current: int

    @property
    def regressed(self) -> bool:
        """tok/s got worse: a DIFFERENT verdict with ratio below 1."""
        return self.verdict == DIFFERENT and self.ratio < 1.0


def per_look_alpha(alpha: float, first: int, cap: int, step: int = 2) -> float:
    """Significance level of each look of a sequential comparison that decides at `first`
    samples and, while UNKNOWN, again every `step` more up to `cap` (Bonferroni over the
    looks). Stopping at the first look with p < alpha would make the chance of a false
    DIFFERENT grow with every look; split, it stays below alpha per decision (docs/PERF.md
    measures both)."""
    looks = 1 + max(0, math.ceil((cap - first) / step))
    return alpha / looks


def smallest_p(n_pairs: int) -> float:
    """The smallest two-sided p-value either paired test can give with n pairs (all of one sign)."""
    return 2.0 * 0.5 ** n_pairs


def _verdict(p: float, ci: tuple[float, float], ratio: float, alpha: float, min_effect: float) -> str:
    if p < alpha and abs(ratio - 1.0) >= min_effect:
        return DIFFERENT
    if 1.0 - min_effect < ci[0] and ci[1] < 1.0 + min_effect:
        return SAME
    return UNKNOWN


def compare_samples(baseline, current, alpha: float = 0.05, min_effect: float = 0.05) -> Comparison:
    """Unpaired comparison (current run vs golden samples recorded earlier)."""
    b, c = np.asarray(baseline, dtype=np.float64), np.asarray(current, dtype=np.float64)
    _, p = mann_whitney_u(c, b)
    mb, mc = float(np.median(b)), float(np.median(c))
    ratio = mc / mb if mb > 0 else math.inf
    ci = bootstrap_ci(lambda x, y: np.median(y) / np.median(x), [b, c])
    return Comparison(_verdict(p, ci, ratio, alpha, min_effect), mb, mc, ratio, p, ci, len(b), len(c))


def sign_test_p(x) -> float:
    """Two-sided exact sign test of log-ratios around 0 (paired ABAB runs)."""
    x = np.asarray(x)
    pos, neg = int((x > 0).sum()), int((x < 0).sum())
    n = pos + neg
    if n == 0:
        return 1.0
    k = min(pos, neg)
    p = 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, p)


def wilcoxon_signed_rank_p(x) -> float:
    """Two-sided exact Wilcoxon signed-rank test of x around 0 (paired log-ratios).

    Zeros are dropped; tied |x| share their average rank, and the exact null distribution
    of the positive rank sum is computed for those (tied) ranks by dynamic programming, so
    it is exact with ties too. Unlike the sign test it uses how far each pair moved, which
    makes it about 1.5x as efficient on roughly normal log-ratios.
    """
    x = np.asarray(x, dtype=np.float64)
    x = x[x != 0]
    n = len(x)
    if n == 0:
        return 1.0
    r2 = np.rint(_ranks(np.abs(x)) * 2).astype(np.int64)   # doubled ranks: integers with ties
    total = int(r2.sum())
    dist = np.zeros(total + 1)
    dist[0] = 1.0
    for r in r2:
        dist[r:] = dist[r:] + dist[:total + 1 - r].copy()
    w = int(r2[x > 0].sum())
    k = np.arange(total + 1)
    p = dist[np.abs(k - total / 2) >= abs(w - total / 2) - 1e-9].sum() / dist.sum()
    return float(min(1.0, p))


PAIRED_TESTS = ("wilcoxon", "sign")


def compare_paired(base, head, alpha: float = 0.05, min_effect: float = 0.05,
                   test: str = "wilcoxon") -> Comparison:
    """Paired comparison of interleaved runs: ratio = median of head_i / base_i; p-value of
    the log-ratios around 0 by the Wilcoxon signed-rank test (default) or the sign test."""
    b, h = np.asarray(base, dtype=np.float64), np.asarray(head, dtype=np.float64)
    if len(b) != len(h) or len(b) == 0:
        raise ValueError("paired comparison needs equally many base and head samples")
    if test not in PAIRED_TESTS:
        raise ValueError(f"unknown paired test {test!r}")
    r = h / b
    ratio = float(np.median(r))
    ci = bootstrap_ci(np.median, [r])
    p = wilcoxon_signed_rank_p(np.log(r)) if test == "wilcoxon" else sign_test_p(np.log(r))
    return Comparison(_verdict(p, ci, ratio, alpha, min_effect), float(np.median(b)),
                      float(np.median(h)), ratio, p, ci, len(b), len(h))


# ------------------------------------------------------------------ paced (per-step interleaved) runs

def _betainc(a: float, b: float, x: float, y: float) -> float:
    """Regularized incomplete beta I_x(a, b), y = 1 - x given exactly: the continued fraction
    of Numerical Recipes (modified Lentz), on the side of x where it converges fast."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, y, x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t), t * t / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=256)
def student_t_ppf(q: float, df: float) -> float:
    """The q-quantile of Student's t (bisection on the CDF: exact to ~1e-12; a decision asks
    for the same few quantiles again and again, hence the cache)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q} outside (0, 1)")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if student_t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def hodges_lehmann(x) -> float:
    """The Hodges-Lehmann location estimate: the median of all pairwise means (x_i + x_j) / 2,
    i <= j. As robust as the median (29 % breakdown) and nearly as efficient as the mean on
    normal data (95 %, the median 64 %)."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) == 0:
        raise ValueError("Hodges-Lehmann of no values")
    i, j = np.triu_indices(len(x))
    return float(np.median((x[i] + x[j]) / 2.0))


def one_sided_t(x) -> tuple[float, float, float]:
    """(mean, standard error, df) of x for a one-sample t test."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n < 2:
        raise ValueError("a t test needs at least two values")
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(n)), float(n - 1)


def compare_paced(pair_log_ratios, alpha: float, floor: float, min_effect: float,
                  baseline: float, current: float) -> Comparison:
    """The verdict of per-step interleaved process pairs (epmci.perf.paced).

    Each process pair gives one value: the robust centre of its per-step log tok/s ratios
    log(head/base) (negative: head slower). On those n values, with the mean m, its standard
    error s and the one-sided t quantile q of 1 - alpha, the ratio head/base = exp(m) has the
    one-sided (1 - alpha) bounds `ci` = (exp(m - q s), exp(m + q s)):

    DIFFERENT: the whole interval is more than `floor` away from 1 -- the upper bound under
    1 - floor (slower: confident the head lost more than `floor`), or the lower bound over
    1 + floor (faster). A true change of exactly `floor` is called DIFFERENT at most alpha
    of the time whatever the noise, so a change inside +-floor never fails more often.
    SAME: the lower bound says the head is at most `min_effect` slower. Otherwise UNKNOWN
    (more pairs narrow the interval). `p_value` is the t test's for "slower by more than
    floor". `baseline` and `current` (tok/s of each side) are reported, not tested.
    """
    m, se, df = one_sided_t(pair_log_ratios)
    margin = math.log(1.0 - floor) if floor < 1 else -math.inf
    if se > 0:
        half = student_t_ppf(1.0 - alpha, df) * se
        p_slower = student_t_cdf((m - margin) / se, df)
    else:    # every pair gave the same value: no doubt about it
        half = 0.0
        p_slower = 0.0 if m < margin else 1.0
    ratio = math.exp(m)
    ci = (math.exp(m - half), math.exp(m + half))
    n = len(pair_log_ratios)
    if ci[1] < 1.0 - floor or ci[0] > 1.0 + floor:
        verdict = DIFFERENT
    elif ci[0] > 1.0 - min_effect:
        verdict = SAME
    else:
        verdict = UNKNOWN
    return Comparison(verdict, baseline, current, ratio, p_slower, ci, n, n)


LATENCY_QUANTILES = (50, 95, 99)


def latency_percentiles(seconds) -> dict[str, float]:
    """p50, p95, p99 of inter-token latencies (linear interpolation between order statistics)."""
    x = np.asarray(seconds, dtype=np.float64)
    if len(x) == 0:
        raise ValueError("no latencies")
    return {f"p{q}": float(np.percentile(x, q)) for q in LATENCY_QUANTILES}


@dataclass(frozen=True)
class TailTest:
    """Is the head's latency tail heavier than the base's? The steps above the pooled
    `quantile` (the top K = ceil((1 - quantile) * N) of all N steps; among equal times the
    base's first) counted per side; under "both sides' steps come from one distribution" the
    head's count is hypergeometric, and `p_value` is the exact one-sided tail
    P(X >= head_above) (Fisher's exact test): a verdict on it false-alarms at most alpha, whatever the distribution, as
    long as steps are exchangeable. One slow step cannot make it fire; a tail that is
    heavier on many steps does. Measured at alpha 0.01 with 576 steps a side (the gate's 6
    pairs x 96), 3 % step jitter: 5 % of the head's steps 2x slower is caught 100 % of the
    time, 2 % of them 34 %, 1 % of them 3x slower 6 % -- a tail of a few steps in 576 is not
    distinguishable from noise at that false-alarm rate (tests/test_perf_stats.py)."""
    quantile: float
    above: int                 # K: steps above the pooled quantile
    head_above: int
    n_base: int
    n_head: int
    p_value: float


def tail_test(base, head, quantile: float = 0.98) -> TailTest:
    b, h = np.asarray(base, dtype=np.float64), np.asarray(head, dtype=np.float64)
    n, nh = len(b) + len(h), len(h)
    if len(b) == 0 or nh == 0:
        raise ValueError("no latencies")
    k = max(1, math.ceil((1.0 - quantile) * n))
    # the k slowest steps; among equal times the base's count first, so a tie never makes
    # the head's tail look heavier (conservative: fewer false alarms, not more)
    values = np.concatenate([b, h])
    is_head = np.r_[np.zeros(len(b), np.int8), np.ones(nh, np.int8)]
    order = np.lexsort((is_head, -values))[:k]
    x = int(is_head[order].sum())
    total = math.comb(n, k)
    p = sum(math.comb(nh, i) * math.comb(n - nh, k - i) for i in range(x, min(k, nh) + 1)) / total
    return TailTest(quantile, k, x, len(b), nh, min(1.0, p))


def p99_regressed(base, head, limit: float, alpha: float) -> tuple[bool, float, TailTest]:
    """The paced p99 inter-token latency rule: (failed, head p99 / base p99, the tail test).
    It fails only when the head's p99 is over `limit` times the base's AND the head holds
    significantly more of the steps above the pooled p98 (TailTest at `alpha`), so one slow
    step cannot fail an unchanged head."""
    ratio = latency_percentiles(head)["p99"] / latency_percentiles(base)["p99"]
    tail = tail_test(base, head)
    return ratio > limit and tail.p_value < alpha, ratio, tail


def cpu_diagnosis(ratio: float, cpu_ratio: float) -> str:
    """What CPU time says about a wall-time change (both as tok/s-style ratios head/base:
    below 1, the head takes longer per step): a slowdown whose CPU time stayed flat (less
    than half of it shows in CPU time) was spent waiting."""
    slow, cpu_slow = 1.0 - ratio, 1.0 - cpu_ratio
    if slow > 0 and cpu_slow < slow / 2:
        return (f"CPU time per step x{cpu_ratio:.3f} is flat: the extra wall time is waiting (I/O latency, "
                f"locks, sleeps), not compute")
    return f"CPU time per step x{cpu_ratio:.3f} moved with it: compute"
