"""The `epmci` command: a thin shell over the library, one module per command (parse the
arguments, make one library call, render, return the exit code). Exit 0 ok, 1 a check
failed, 2 the tool could not run (bad input: one line on stderr)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from importlib import metadata

from ..check.workdirs import remove_live_workdirs
from ..contract import process
from ..errors import InputError
from . import bench, build, check, compare, conformance, golden, history, merge, model

COMMANDS = (model, build, check, merge, conformance, golden, history, bench, compare)


def version() -> str:
    try:
        return metadata.version("epmci")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="epmci", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="version", version=f"epmci {version()}")
    sub = ap.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return ap


def _stop(signum: int, _frame) -> None:
    """SIGTERM/SIGHUP/SIGINT (a cancelled CI job, a closed terminal, Ctrl-C): kill the engines, which run
    in sessions of their own and would outlive epmci, remove the running checks' work dirs
    (unless --keep-work), then exit at once (a clean unwind
    would let the worker threads start the next engine runs)."""
    killed = process.kill_all()
    removed = remove_live_workdirs()
    print(f"epmci: stopped by {signal.Signals(signum).name}; {killed} engine run(s) killed, "
          f"{removed} work dir(s) removed", file=sys.stderr)
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)} if main_thread else {}
    try:
        return _run(args)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except InputError as e:
        print(f"epmci: error: {e.where}: {e.problem}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`epmci model info x | head`): nothing more to say; keep the
        # interpreter from reporting the flush of the dead pipe at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
