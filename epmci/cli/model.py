"""`epmci model make|info`: make a synthetic preset model, or summarize a GGUF file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TextIO

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


class MakeProgress:
    """A progress bar on stderr: redrawn in place on a terminal, else one line per tenth."""

    def __init__(self, stream: TextIO = sys.stderr):
        self.stream, self.tty = stream, stream.isatty()
        self.started = time.monotonic()
        self.last: tuple[str, int] | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        tenth = 10 * done // max(1, total)
        if not self.tty and self.last == (stage, tenth):
            return
        self.last = (stage, tenth)
        bar = "#" * (30 * done // max(1, total))
        amount = (f"{done / 1e9:.2f}/{total / 1e9:.2f} GB" if stage == "write"
                  else f"layer {done}/{total}")
        line = f"{stage:9s} [{bar:30s}] {100 * done // max(1, total):3d}%  {amount}  {time.monotonic() - self.started:.0f} s"
        end = "\n" if not self.tty or (done >= total and stage == "calibrate") else ""
        self.stream.write(("\r" if self.tty else "") + line + end)
        self.stream.flush()


def make(a: argparse.Namespace) -> int:
    print(make_model(a.preset, a.seed, a.out, MakeProgress()))
    return 0


def show_info(a: argparse.Namespace) -> int:
    s = model_summary(ModelFile(a.path))
    print(json.dumps(s, indent=1) if a.json else render_summary(s))
    return 0
