"""Pictures where they say more than a table, written next to the JUnit file: the model
suite's KL(reference || engine) at every position against its bound, and the paced A/B's
per-pair head/base ratios with the decision bounds. Drawn by matplotlib (the optional
`plots` extra: pip install 'epmci[plots]'); without it there are none and the summary says so.
Renders only what the results already hold (their properties), so a plot cannot disagree
with the verdict beside it."""

from __future__ import annotations

from pathlib import Path

from ..check.result import CheckReport, CheckResult

MISSING = "plots skipped: matplotlib is not installed (pip install 'epmci[plots]')"


def write_plots(report: CheckReport, out_dir: str | Path) -> tuple[list[Path], str | None]:
    """The SVG files written into out_dir, and a note when none could be drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], MISSING
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for r in report.results:
        draw = _model_kl if (r.suite, r.name) == ("model", "prompt positions") else \
            _paced_ratios if "pair_ratios" in r.properties else None
        if draw is None:
            continue
        fig = draw(plt, r)
        if fig is None:
            continue
        path = out / f"{r.suite}-{''.join(c if c.isalnum() else '-' for c in r.name)}.svg"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written, None


def _model_kl(plt, r: CheckResult):
    p = r.properties
    prompt, decode = p.get("prompt_kl") or [], p.get("decode_kl") or []
    if not prompt and not decode:
        return None
    floor = 1e-12                    # an exact match plots at the floor of the log axis
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.semilogy(range(len(prompt)), [max(x, floor) for x in prompt], ".", ms=2, label="prompt positions")
    ax.semilogy(range(len(prompt), len(prompt) + len(decode)), [max(x, floor) for x in decode], ".", ms=4,
                label="decode steps" + (" (teacher-forced)" if p.get("teacher_forced") else ""))
    if p.get("max_kl_allowed"):
        ax.axhline(p["max_kl_allowed"], color="red", lw=1, label=f"bound {p['max_kl_allowed']:g}")
    first = p.get("prompt_first_differing_position", p.get("decode_first_differing_position"))
    if first is not None:
        ax.axvline(first, color="grey", ls="--", lw=1, label=f"first failing position {first}")
    return _labelled(fig, ax, "position", "KL(reference || engine), nats", f"model suite, {p.get('mode', '')}: {r.status}")


def _paced_ratios(plt, r: CheckResult):
    p = r.properties
    ratios = p.get("pair_ratios") or []
    if not ratios:
        return None
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(range(1, len(ratios) + 1), ratios, "o", label="head/base, per process pair")
    if "ci_low" in p and "ci_high" in p:
        ax.axhspan(p["ci_low"], p["ci_high"], color="C0", alpha=0.15, label="decision bounds")
    if p.get("min_effect"):
        for y in (1 - p["min_effect"], 1 + p["min_effect"]):
            ax.axhline(y, color="red", lw=1, ls=":")
    ax.axhline(1.0, color="black", lw=0.8)
    return _labelled(fig, ax, "process pair", "decode tok/s, head / base", f"{r.name}: {p.get('verdict', r.status)}")


def _labelled(fig, ax, xlabel: str, ylabel: str, title: str):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
