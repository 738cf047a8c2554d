"""The paced perf gate's error rates, estimated from recorded process pairs.

The variance of a paced decision sits in its process pairs (docs/PERF.md, "where the noise
is"), so pairs are what is recorded (bench/pairs.py record: every step's wall and CPU time
of each pair, per condition), and decisions are replayed: many sets of pairs drawn with
replacement from one condition's recording go through the gate's own decision
(paced.sequential_verdict: the same looks and the same test as --perf-base). For an
unchanged head the share of DIFFERENT-and-slower verdicts is the false-alarm rate; for a
slowed head the share of DIFFERENT-and-slower is the detection; the pairs each decision
used are its cost. Rates come with Wilson intervals over the replayed decisions -- and,
because replays of one recording are not independent, with the number of recorded pairs
beside them: the recording bounds the precision, not the replay count.

Resampling treats pairs as independent draws; `drift` checks it on the recording (a rank
correlation of the pair values with their order: a machine that warms up or a load that
changes over the recording would show).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..compare.stats import DIFFERENT, SAME, UNKNOWN, p99_regressed
from .paced import sequential_verdict


@dataclass(frozen=True)
class Decisions:
    """Replayed decisions of one condition."""
    condition: str
    recorded_pairs: int
    n: int                                   # decisions replayed
    slower: int                              # DIFFERENT and head slower
    faster: int                              # DIFFERENT and head faster
    same: int
    unknown: int
    pairs_used: list[int] = field(default_factory=list)

    def rate(self, k: int) -> tuple[float, float, float]:
        """(share, Wilson 95 % low, high) of k of the n decisions."""
        return (k / self.n, *wilson(k, self.n))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial share k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def replay(condition: str, samples: list[float], *, n: int, rng: np.random.Generator, pairs: int,
           step_pairs: int, max_pairs: int, alpha: float, floor: float, min_effect: float) -> Decisions:
    """n decisions on pair values drawn with replacement from one condition's recording."""
    if not samples:
        raise ValueError(f"{condition}: no recorded pairs")
    x = np.asarray(samples, dtype=np.float64)
    counts = {"slower": 0, "faster": 0, SAME: 0, UNKNOWN: 0}
    used = []
    for _ in range(n):
        draw = list(x[rng.integers(0, len(x), max_pairs)])
        c, k = sequential_verdict(draw, pairs=pairs, step_pairs=step_pairs, max_pairs=max_pairs, alpha=alpha,
                                  floor=floor, min_effect=min_effect)
        key = ("slower" if c.ratio < 1 else "faster") if c.verdict == DIFFERENT else c.verdict
        counts[key] += 1
        used.append(k)
    return Decisions(condition, len(x), n, counts["slower"], counts["faster"], counts[SAME], counts[UNKNOWN], used)


def replay_p99(steps: list[tuple[list[float], list[float]]], *, n: int, rng: np.random.Generator, pairs: int,
               limit: float, alpha: float) -> int:
    """How many of n p99 verdicts fail: each on `pairs` process pairs drawn with replacement
    from one condition's recording, given as (base, head) measured step times per pair, their
    steps pooled per side as --perf-base pools them (compare.stats.p99_regressed)."""
    if not steps:
        raise ValueError("no recorded pairs")
    fails = 0
    for _ in range(n):
        draw = [steps[i] for i in rng.integers(0, len(steps), pairs)]
        base = [x for b, _ in draw for x in b]
        head = [x for _, h in draw for x in h]
        fails += p99_regressed(base, head, limit, alpha)[0]
    return fails


def in_order(samples: list[float], *, pairs: int, step_pairs: int, max_pairs: int, alpha: float, floor: float,
             min_effect: float) -> list[tuple[str, float, int]]:
    """The gate's decisions on the recording as it was taken, no resampling: consecutive
    disjoint runs of pairs, each decided as --perf-base would (its looks), until too few
    pairs are left for the next look. [(verdict -- "slower"/"faster" for DIFFERENT, the
    ratio, pairs used)]. Each is a real decision; they confirm what the replays estimate."""
    out, i = [], 0
    while len(samples) - i >= pairs:
        try:
            c, k = sequential_verdict(samples[i:], pairs=pairs, step_pairs=step_pairs, max_pairs=max_pairs,
                                      alpha=alpha, floor=floor, min_effect=min_effect)
        except ValueError:           # UNKNOWN at a look, and too few pairs left for the next one
            break
        out.append((("slower" if c.ratio < 1 else "faster") if c.verdict == DIFFERENT else c.verdict, c.ratio, k))
        i += k
    return out


def drift(samples: list[float]) -> tuple[float, float]:
    """Spearman's rank correlation of the pair values with their recording order, and its
    two-sided p-value (normal approximation, fine from ~10 pairs): near 0 and p large means
    no trend over the recording, so pairs may be resampled as independent draws."""
    n = len(samples)
    if n < 4:
        return 0.0, 1.0
    r = np.argsort(np.argsort(samples)).astype(np.float64)
    i = np.arange(n, dtype=np.float64)
    rho = float(np.corrcoef(r, i)[0, 1]) if np.std(r) > 0 else 0.0
    z = rho * math.sqrt(n - 1)
    return rho, math.erfc(abs(z) / math.sqrt(2))
