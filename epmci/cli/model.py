"""`epmci model make|info`: make a synthetic preset model, or summarize a GGUF file."""

from __future__ import annotations

import argparse
import json

from ..gguf.file import ModelFile
from ..gguf.info import model_summary, render_summary
from ..synth.presets import PRESETS
from ..synth.store import make_model


def add_parser(sub) -> None:
    model = sub.add_parser("model", help="make or inspect synthetic qwen3moe GGUF models")
    msub = model.add_subparsers(dest="model_command", required=True)
    mk = msub.add_parser("make", help="write a preset model (cached unless --out)")
    mk.add_argument("--preset", required=True, help=" | ".join(PRESETS))
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--out", default=None, help="write here instead of the cache")
    mk.set_defaults(func=make)
    info = msub.add_parser("info", help="print a model's dimensions and expert layout")
    info.add_argument("path")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=show_info)


def make(a: argparse.Namespace) -> int:
    print(make_model(a.preset, a.seed, a.out))
    return 0


def show_info(a: argparse.Namespace) -> int:
    s = model_summary(ModelFile(a.path))
    print(json.dumps(s, indent=1) if a.json else render_summary(s))
    return 0
