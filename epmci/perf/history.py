"""The perf history of a runner profile, and the drift no single pull request shows.

Every check on the default branch appends one entry to a JSON-lines file (one per runner
profile, asv-style: kept where the workflow keeps it, a results branch or an artifact): its
commit, date, model, machine fingerprint and metrics per perf scenario --
`decode_ratio_vs_base`, the paced head/base tok/s ratio against the base it was run with
(the workflow runs main against its last golden re-recording, so this is the drift since
then, measured in the same run: ~0.4 % noise), `decode_tok_s` (the median of the timed
runs: 16-token runs vary by ~12 % run to run here, so it shows only large steps) and peak
RSS. A golden re-recording appends an entry marked `rebaseline`, and a new base starts a
ratio's series anew: drift is measured from there.

Change points come from E-Divisive (MongoDB's signal-processing-algorithms, the detector
behind their CI's perf alerts), seeded so a history always gives the same answer. A metric
drifts when both hold:
- E-Divisive finds a change point since the last rebaseline (the series really moved,
  not one noisy run), and
- the median of the `recent` newest entries is worse than the mean of the entries before
  the first change point by more than `max_drift` -- five 1 % steps are each too small
  for a pull request's gate and together they fail here -- and by more than that series'
  own noise allows (NOISE_SIGMAS standard errors of such a median, from the entries before
  the first change point): 16-token tok/s runs vary by ~12 % here, and a 3 % rule on them
  failed 12 % of unchanged histories (bench/history_noise.py --source runs).
The verdict names every step: the commit range it happened in (the entry before the change
point, the entry at it) and its size. A gated metric that drifted, or got better by as much
(a gain golden does not know: the next slowdown would be measured from the old level),
carries a proposal to re-record golden, which `epmci history check` prints and the
golden-update workflow puts in its pull request. The error rates of the rule on recorded noise are in
docs/perf-gate.md (bench/history_power.py).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..fsutil import atomic_write

FORMAT = "epmci-history/1"
TOK_S, RSS, RATIO = "decode_tok_s", "peak_rss_mb", "decode_ratio_vs_base"
HIGHER_IS_BETTER = {TOK_S: True, RSS: False, RATIO: True}
# Metrics whose drift fails: the paced ratio (~0.5 % noise an entry) and peak RSS. Decode
# tok/s of the timed runs is charted, not gated: 16-token runs vary by ~12 % run to run and
# the rule failed 6 % of unchanged histories on them (docs/perf-data/history-noise/).
GATED = {RATIO, RSS}
NOISE_SIGMAS = 3.0
MIN_REFERENCE = 5    # entries before the first change point needed to tell the series' noise


@dataclass(frozen=True)
class DriftRule:
    max_drift: float             # worse than this (relative) since the rebaseline fails
    recent: int                  # newest entries whose median is "now"
    pvalue: float                # E-Divisive's permutation test
    permutations: int = 199      # enough for a p-value of 0.005 to be resolved
    seed: int = 0

    @classmethod
    def of(cls, perf) -> "DriftRule":
        """From the perf settings (perf.drift_*)."""
        return cls(perf.drift_max, perf.drift_recent, perf.drift_pvalue)


def entry_of_report(report: dict, commit: str, date: str | None = None, rebaseline: bool = False) -> dict:
    """The history entry of one check report (epmci check --json): the perf suite's timed
    tok/s and peak RSS per scenario. InputError when the report timed nothing."""
    metrics: dict[str, float] = {}
    base = None
    for suite in report.get("suites", []):
        if suite.get("name") != "perf":
            continue
        for r in suite.get("results", []):
            scen, _, what = r.get("name", "").partition(": ")
            props = r.get("properties") or {}
            if what == "decode tok/s vs golden" and props.get("samples"):
                metrics[f"{TOK_S}/{scen}"] = round(statistics.median(float(x) for x in props["samples"]), 4)
            elif what == "peak RSS" and props.get("peak_rss_mb") is not None:
                metrics[f"{RSS}/{scen}"] = float(props["peak_rss_mb"])
            elif what.startswith("decode tok/s vs base ") and props.get("mode") == "paced" and "ratio" in props:
                metrics[f"{RATIO}/{scen}"] = float(props["ratio"])
                base = props.get("base_sha")
    if not any(k.startswith((TOK_S, RATIO)) for k in metrics):
        raise InputError("report", "the check timed no decode run (a --fast or --no-timing check has no "
                                   "tok/s for the history)")
    meta = report.get("meta", {})
    return {"format": FORMAT, "commit": commit, "date": date or report.get("started", ""),
            "model": Path(str(meta.get("model", ""))).stem, "profile": meta.get("profile"),
            "machine": meta.get("machine", {}), "verdict": report.get("verdict"), "rebaseline": rebaseline,
            "base": base if any(k.startswith(RATIO) for k in metrics) else None, "metrics": metrics}


def read_history(path: str | os.PathLike) -> list[dict]:
    """Entries in file order; a missing file is an empty history."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(p, f"line {i} is not JSON ({err.msg})") from None
        if not isinstance(e, dict) or e.get("format") != FORMAT or not isinstance(e.get("metrics"), dict) \
                or not isinstance(e.get("commit"), str):
            raise InputError(p, f"line {i} is not an {FORMAT} entry (format, commit, metrics)")
        bad = [k for k, v in e["metrics"].items() if isinstance(v, bool) or not isinstance(v, (int, float))
               or not math.isfinite(v)]
        if bad:
            raise InputError(p, f"line {i}: metric {bad[0]} is not a finite number")
        out.append(e)
    return out


def append(path: str | os.PathLike, entry: dict) -> None:
    """Add one entry (written whole to a temp file, then renamed: never half a history)."""
    old = Path(path).read_text(encoding="utf-8") if Path(path).exists() else ""
    read_history(path)                                   # refuse to extend a broken file
    if old and not old.endswith("\n"):
        old += "\n"
    atomic_write(path, old + json.dumps(entry, sort_keys=True) + "\n")


def change_points(values: list[float], rule: DriftRule) -> list[int]:
    """Indices where E-Divisive starts a new segment (sorted), on a seeded permutation test
    (the library shuffles with NumPy's global generator: its state is put back after)."""
    from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive
    if len(values) < 4:
        return []
    state = np.random.get_state()
    try:
        np.random.seed(rule.seed)
        return sorted(int(i) for i in e_divisive(np.asarray(values, dtype=np.float64), pvalue=rule.pvalue,
                                                 permutations=rule.permutations))
    finally:
        np.random.set_state(state)


@dataclass
class Step:
    before: str          # commit of the entry before the change point
    at: str              # commit of the first entry after it
    ratio: float         # mean after / mean before (the segments either side)

    def text(self, metric: str) -> str:
        return f"{self.before[:12]}..{self.at[:12]} {100 * (self.ratio - 1):+.1f} %"


@dataclass
class MetricDrift:
    metric: str
    commits: list[str]
    values: list[float]
    start: int                             # index of the first entry since the last rebaseline
    change_points: list[int] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    total: float | None = None             # recent median / reference mean (None: nothing to compare)
    noise: float | None = None             # the smallest relative change the series' noise lets count
    failed: bool = False
    message: str = ""
    proposal: str = ""                     # re-record golden, and why (the golden-update workflow shows it)

    def to_dict(self) -> dict:
        return asdict(self)


def metric_drift(entries: list[dict], metric: str, rule: DriftRule) -> MetricDrift:
    """The drift verdict of one metric over the history (see the module doc)."""
    have = [e for e in entries if metric in e["metrics"]]
    # a ratio against a base is measured from the first entry against that base
    start = max((i for i, e in enumerate(have)
                 if e.get("rebaseline") or (i and e.get("base") != have[i - 1].get("base"))), default=0)
    commits = [e["commit"] for e in have]
    values = [float(e["metrics"][metric]) for e in have]
    d = MetricDrift(metric, commits, values, start)
    series = values[start:]
    if len(series) < rule.recent + 2:
        d.message = f"{len(series)} entries since the rebaseline: too few to look for drift"
        return d
    cps = change_points(series, rule)
    d.change_points = [start + i for i in cps]
    bounds = [0, *cps, len(series)]
    means = [statistics.fmean(series[a:b]) for a, b in zip(bounds, bounds[1:])]
    d.steps = [Step(commits[start + i - 1], commits[start + i], means[k + 1] / means[k]) for k, i in enumerate(cps)]
    reference = means[0]
    now = statistics.median(series[-rule.recent:])
    d.total = now / reference
    worse = 1 - d.total if HIGHER_IS_BETTER.get(metric.split("/")[0], True) else d.total - 1
    # what the series' own noise allows: a median of `recent` entries moves by about
    # sd / sqrt(recent); a deficit within NOISE_SIGMAS of that is no verdict
    ref = series[:cps[0]] if cps else series
    d.noise = (NOISE_SIGMAS * statistics.stdev(ref) / math.sqrt(rule.recent) / abs(reference)
               if len(ref) >= MIN_REFERENCE and reference else math.inf)
    steps = "; ".join(s.text(metric) for s in d.steps) or "no change point"
    drifted = bool(cps) and worse > max(rule.max_drift, d.noise)
    d.failed = drifted and metric.split("/")[0] in GATED
    d.message = (f"{metric}: now {100 * (d.total - 1):+.1f} % against {commits[start][:12]}.. "
                 f"({len(series)} entries since the rebaseline; steps: {steps})")
    if drifted and not d.failed:
        d.message += (f" -- worse by more than {100 * rule.max_drift:g} % (informational: this metric's "
                      f"run-to-run noise is too high to fail on; {RATIO} is the gated one)")
    elif d.failed:
        d.message += f" -- worse by more than {100 * rule.max_drift:g} %"
    elif cps and worse > rule.max_drift:
        d.message += (f" -- worse by more than {100 * rule.max_drift:g} %, but within this series' noise "
                      f"({100 * d.noise:.1f} %): no verdict")
    improved = bool(cps) and -worse > max(rule.max_drift, d.noise)
    if metric.split("/")[0] in GATED and (d.failed or improved):
        since = f"since {commits[start][:12]} ({steps})"
        d.proposal = (f"{metric} is {100 * abs(d.total - 1):.1f} % {'better' if improved else 'worse'} {since}: "
                      + ("re-record golden to keep the gain -- until then a slowdown is measured from the old level"
                         if improved else "fix it, or accept it by re-recording golden with the reason"))
    return d


def drift(entries: list[dict], rule: DriftRule) -> list[MetricDrift]:
    """Every metric's verdict, in name order."""
    names = sorted({k for e in entries for k in e["metrics"]})
    return [metric_drift(entries, m, rule) for m in names]
