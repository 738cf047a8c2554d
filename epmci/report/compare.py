"""The text rendering of `epmci compare` (epmci.check.compare_engines.EngineComparison): the
summary, then the positions that matter -- every top-1 disagreement and KL over the
threshold, and the largest KLs. The JSON (`to_dict`) has every position."""

from __future__ import annotations

from ..check.compare_engines import EngineComparison

SHOWN = 20        # at most this many disagreeing positions listed
WORST = 5         # and the positions of the largest KL


def render_comparison(c: EngineComparison) -> str:
    s, t = c.summary(), c.thresholds
    P, D = c.n_prefill, c.positions - c.n_prefill
    out = [f"epmci compare: {c.model}",
           f"  A: {c.engines[0]} ({c.names[0]})",
           f"  B: {c.engines[1]} ({c.names[1]})",
           f"  {c.positions} positions teacher-forced (--tokens-in): {P} prefill at -b {c.batch}, {D} decode steps",
           f"  top-1 agreement {s['top1_agree']}/{c.positions} ({100 * s['top1_agreement']:.2f} %), "
           f"KL(A||B) mean {s['kl_mean']:.3g} max {s['kl_max']:.3g} nats (position {s['kl_max_position']}), "
           f"max |diff| {s['max_abs_diff']:.3g}"]
    d = c.diff
    bad = [i for i in range(c.positions) if not d.agree[i] or d.kl[i] > t.max_kl]
    worst = [int(i) for i in d.kl.argsort()[::-1][:WORST] if d.kl[i] > 0]
    rows = sorted(set(bad[:SHOWN]) | set(worst))
    if rows:
        out += ["", f"  {'position':>8}  {'phase':<7}  {'token':>6}  {'top1 A':>6}  {'top1 B':>6}  "
                    f"{'KL(A||B)':>9}  {'max|diff|':>9}  {'A margin':>8}"]
        for i in rows:
            mark = "" if d.agree[i] else "  <- top-1 differs" + (" (near-tie)" if d.margin_a[i] < 0.01 else "")
            out.append(f"  {i:>8}  {c.phase(i):<7}  {c.tokens[i]:>6}  {d.top1_a[i]:>6}  {d.top1_b[i]:>6}  "
                       f"{d.kl[i]:>9.3g}  {d.abs_diff[i]:>9.3g}  {d.margin_a[i]:>8.3g}{mark}")
        if len(bad) > SHOWN:
            out.append(f"  ... {len(bad) - SHOWN} more positions over the thresholds (all in --json)")
    verdict = "PASS" if c.passed else "FAIL"
    out += ["", f"epmci compare: {verdict} -- thresholds: KL <= {t.max_kl:g} nats at every position, "
                f"top-1 agreement >= {100 * t.min_top1:g} %"]
    return "\n".join(out)
