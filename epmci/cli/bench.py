"""`epmci bench`: a matrix of engine settings, KPIs and fingerprints per experiment."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config.experiments import MATRICES
from ..perf.bench import bench_matrix, flagged, to_markdown, write_outputs
from .options import add_config_args, config_from_args


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="the experiment matrix: KPIs and fingerprints per engine setting")
    add_config_args(b)
    b.add_argument("--suite", default="quick", choices=[*MATRICES, "all"])
    b.add_argument("--only", help="comma-separated substrings: run only experiments whose name has one")
    b.add_argument("--repeat", type=int, default=3, help="runs per experiment and prompt (median)")
    b.add_argument("--n-predict", type=int, help="generated tokens per run (default 32)")
    b.add_argument("--threads", type=int, help="engine compute threads (-t) of the baseline")
    b.add_argument("--out", default="results", help="directory for bench_<label>.json and .md")
    b.add_argument("--label", help="output file label (default: the suite)")
    b.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    cfg = config_from_args(a)
    say = lambda s: print(s, flush=True)  # noqa: E731
    bench = bench_matrix(cfg, a.suite, a.only, a.repeat, a.n_predict, progress=say)
    jf, mf = write_outputs(bench, Path(a.out), a.label or a.suite)
    say("")
    say(to_markdown(bench))
    say(f"[bench] JSON -> {jf}")
    say(f"[bench] Markdown -> {mf}")
    bad = flagged(bench)
    if bad:
        say(f"[bench] flagged (failed, or outputs differ): {', '.join(bad)}")
        return 1
    return 0
