"""`epmci contract-test`: the conformance suite alone -- does the engine speak
docs/engine-contract.md? `epmci check --suites contract` with the same reports. Exit 0 it
does, 1 an item failed, 2 the check could not run."""

from __future__ import annotations

import argparse

from . import check
from .options import add_config_args, add_output_args


def add_parser(sub) -> None:
    c = sub.add_parser("contract-test", help="the conformance suite: every documented behaviour of the engine "
                                             "contract, probed and reported per item")
    add_config_args(c)
    c.add_argument("--items", help="comma-separated items to probe (default: all)")
    add_output_args(c)
    c.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    a.suites = "contract"
    if a.items:
        a.set = [*a.set, "contract.items=[" + ", ".join(repr(x.strip()) for x in a.items.split(",") if x.strip()) + "]"]
    return check.run(a)
