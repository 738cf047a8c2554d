"""`epmci compare`: two engines on the same tokens, position by position (teacher-forced).
Exit 0 within the thresholds, 1 over them, 2 when the engines cannot be compared."""

from __future__ import annotations

import argparse
import json

from ..check.compare_engines import Thresholds, compare_engines
from ..config import load_config, parse_set, set_path
from ..errors import InputError
from ..fsutil import atomic_write
from ..report.compare import render_comparison


def add_parser(sub) -> None:
    c = sub.add_parser("compare", help="two engines on the same tokens (--tokens-in): top-1, KL, max |diff| "
                                       "per position")
    c.add_argument("--engine-cmd", action="append", default=[], metavar="CMD",
                   help="an engine (twice: A and B; once: the bundled engine is A)")
    c.add_argument("--config", help="settings file (default: epmci.yaml in the cwd or a parent)")
    c.add_argument("--model", help="preset name or path to a GGUF (default: model of epmci.yaml)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any setting")
    c.add_argument("--prompt", help="text whose tokens are fed (default: prompts.model, repeated)")
    c.add_argument("--positions", type=int, default=128, help="prompt tokens, evaluated as the prefill (128)")
    c.add_argument("--decode", type=int, default=16, help="more tokens, each evaluated alone as a decode step (16)")
    c.add_argument("--batch", type=int, default=1, help="-b of the prefill (1: one position per evaluation)")
    c.add_argument("--max-kl", type=float, default=Thresholds.max_kl, help="KL(A||B) allowed at every position")
    c.add_argument("--min-top1", type=float, default=Thresholds.min_top1, help="share of positions whose top-1 must agree")
    c.add_argument("--json", metavar="PATH", help="write every position's figures as JSON")
    c.add_argument("--workdir", help="where engine outputs go (default: a temp dir)")
    c.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    if len(a.engine_cmd) not in (1, 2):
        raise InputError("--engine-cmd", f"give one or two engines, got {len(a.engine_cmd)}")
    for key, v, lo in (("--positions", a.positions, 1), ("--decode", a.decode, 0), ("--batch", a.batch, 1)):
        if v < lo:
            raise InputError(key, f"must be >= {lo}, got {v}")
    if not (a.max_kl >= 0 and 0 <= a.min_top1 <= 1):
        raise InputError("--max-kl/--min-top1", "need max-kl >= 0 and min-top1 in [0, 1]")
    over = parse_set(a.set)
    if a.model:
        set_path(over, "model", a.model)
    cfg = load_config(a.config, over)
    cmds = [None, *a.engine_cmd] if len(a.engine_cmd) == 1 else list(a.engine_cmd)
    c = compare_engines(cfg, cmds, prompt=a.prompt or cfg.prompts.model, positions=a.positions, decode=a.decode,
                        batch=a.batch, thresholds=Thresholds(a.max_kl, a.min_top1), workdir=a.workdir)
    print(render_comparison(c))
    if a.json:
        atomic_write(a.json, json.dumps(c.to_dict(), indent=1) + "\n")
    return 0 if c.passed else 1
