"""The `epmci` command: a thin shell over the library. Exit 0 ok, 1 check failed, 2 could not run."""

from __future__ import annotations

import argparse
import json
import sys

from .errors import InputError


def _cmd_model_make(a: argparse.Namespace) -> int:
    from .models.store import make_model
    path = make_model(a.preset, a.seed, a.out)
    print(path)
    return 0


def _cmd_model_info(a: argparse.Namespace) -> int:
    from .gguf_file import ModelFile
    from .models.info import model_summary, render_summary
    s = model_summary(ModelFile(a.path))
    print(json.dumps(s, indent=1) if a.json else render_summary(s))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="epmci", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="make or inspect synthetic qwen3moe GGUF models")
    msub = model.add_subparsers(dest="model_command", required=True)
    mk = msub.add_parser("make", help="write a preset model (cached unless --out)")
    mk.add_argument("--preset", required=True, help="tiny | ci | bench")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--out", default=None, help="write here instead of the cache")
    mk.set_defaults(func=_cmd_model_make)
    info = msub.add_parser("info", help="print a model's dimensions and expert layout")
    info.add_argument("path")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=_cmd_model_info)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as e:
        print(f"epmci: error: {e.where}: {e.problem}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
