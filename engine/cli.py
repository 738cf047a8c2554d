"""`python -m engine` / `epm-engine`: the engine CLI of docs/engine-contract.md.

Generated text goes to stdout, diagnostics to stderr. A model, flag or setting the engine
cannot use is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import sys
import time

from .contract_info import KERNEL_PATHS, contract_info
from .dumps import MoEDumpWriter, PrefetchDumpWriter, StateDumpWriter, write_atomic, write_logits
from .gguf_model import ModelError
from .machine import usable_cpus
from .token_file import read_tokens

PROG = "epm-engine"
N_PREDICT = 32


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line is the contract's one line (ModelError), not usage text."""

    def error(self, message: str):
        raise ModelError(message)


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog=PROG, description="expert-paged qwen3moe and qwen35moe engine")
    ap.add_argument("--contract-info", action="store_true",
                    help="print what this engine declares (contract version, features) as JSON and exit")
    ap.add_argument("-m", "--model")
    ap.add_argument("-p", "--prompt")
    ap.add_argument("-n", "--n-predict", type=int, help=f"tokens to generate (default {N_PREDICT})")
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int,
                    help="compute threads (default: the CPUs this process may use, engine/machine.py)")
    ap.add_argument("-b", "--batch-size", type=int, default=32, help="prefill micro-batch")
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-chat", action="store_true", help="feed the prompt without the chat template")
    ap.add_argument("--no-interactive", action="store_true", help="accepted for compatibility; never interactive")
    ap.add_argument("--stats-file", help="append one JSON record per phase (prefill, decode)")
    ap.add_argument("--dump-logits", action="store_true")
    ap.add_argument("--logits-out", help="with --dump-logits: int32 n_vocab, then float32 rows")
    ap.add_argument("--no-pager", action="store_true", help="read experts in place from the mapped file")
    ap.add_argument("--arena-mb", type=float, help="expert arena size (SDQ_ARENA_MB overrides)")
    ap.add_argument("--ram-budget-mb", type=float, help="refuse to start unless everything fits")
    ap.add_argument("--no-prefetch", action="store_true")
    ap.add_argument("--profile-out", help="write per-(layer, expert) routing counts")
    ap.add_argument("--selftest", metavar="L:E:N:OUT", action="append",
                    help="run one expert through the paged path (repeatable: each in turn, one process)")
    ap.add_argument("--tokens-in", metavar="FILE", help="evaluate these tokens instead of -p/-n (teacher forcing)")
    ap.add_argument("--kernels", choices=("auto", *KERNEL_PATHS),
                    help="product kernels, same bits on each (default: EPM_KERNELS, else auto: the fastest this CPU runs)")
    ap.add_argument("--pace-fds", metavar="R,W", help="hold each decode step for a byte on fd R, report it on fd W")
    return ap


class Pacer:
    """--pace-fds R,W (docs/engine-contract.md, Pacing): each decode step waits for one byte
    on R, then its wall and CPU time go to W as one JSON line, so a gate can interleave the
    steps of two engines and time each one alone."""

    def __init__(self, spec: str):
        try:
            self.r, self.w = (int(x) for x in spec.split(","))
        except ValueError:
            raise ModelError(f"--pace-fds: expected R,W (two file descriptors), got {spec!r}") from None
        if self.r == self.w or min(self.r, self.w) < 0:
            raise ModelError(f"--pace-fds: R and W must be two different descriptors, got {spec!r}")
        for fd in (self.r, self.w):
            try:
                os.fstat(fd)
            except OSError:
                raise ModelError(f"--pace-fds: file descriptor {fd} is not open") from None
        self.steps = 0
        self._wall0 = self._cpu0 = 0.0

    def _send(self, **record) -> None:
        line = (json.dumps(record) + "\n").encode()
        try:
            while line:
                line = line[os.write(self.w, line):]
        except OSError as e:
            raise ModelError(f"--pace-fds: cannot write to descriptor {self.w}: {e}") from None

    def before_step(self) -> None:
        if self.steps == 0:
            self._send(event="ready")
        if not os.read(self.r, 1):
            raise ModelError(f"--pace-fds: descriptor {self.r} closed before decode step {self.steps + 1}")
        self._wall0, self._cpu0 = time.perf_counter(), time.process_time()

    def after_step(self) -> None:
        wall, cpu = time.perf_counter() - self._wall0, time.process_time() - self._cpu0
        self.steps += 1
        self._send(event="step", step=self.steps, wall_s=wall, cpu_s=cpu)

    def end(self) -> None:
        self._send(event="end", steps=self.steps)
        os.close(self.w)


def _pager_config(a: argparse.Namespace):
    from .paging.config import PagerConfig
    return PagerConfig.from_env(arena_mb=a.arena_mb, ram_budget_mb=a.ram_budget_mb,
                                prefetch=False if a.no_prefetch else None)


def _kernel_path(a: argparse.Namespace) -> str:
    """--kernels, else EPM_KERNELS, else auto; one a CPU cannot run is the contract's one line."""
    from . import kernels
    name = a.kernels or os.environ.get("EPM_KERNELS", "").strip() or "auto"
    try:
        return kernels.set_kernel_path(name)
    except ValueError as e:
        raise ModelError(f"{'--kernels' if a.kernels else 'EPM_KERNELS'}: {e}") from None


def run(a: argparse.Namespace) -> int:
    if a.contract_info:
        print(json.dumps(contract_info()))
        return 0
    from .runtime import Engine, Options
    if not a.model:
        raise ModelError("-m/--model: a model file is required")
    if a.dump_logits and not a.logits_out:
        raise ModelError("--dump-logits: --logits-out PATH is required")
    if a.tokens_in and (a.prompt is not None or a.n_predict is not None):
        raise ModelError("--tokens-in: the tokens are given, so -p and -n do not apply")
    if a.n_predict is None:
        a.n_predict = N_PREDICT
    threads_auto = a.threads is None
    if threads_auto:
        a.threads = usable_cpus()
    for name in ("n_predict", "ctx_size", "threads", "batch_size"):
        if getattr(a, name) < (0 if name == "n_predict" else 1):
            raise ModelError(f"--{name.replace('_', '-')}: must be positive, got {getattr(a, name)}")
    if a.profile_out and a.no_pager:
        raise ModelError("--profile-out: routing counts come from the pager (drop --no-pager)")
    if a.pace_fds and (a.selftest or a.tokens_in):
        raise ModelError("--pace-fds: paces generated decode steps; --selftest and --tokens-in generate none")
    pacer = Pacer(a.pace_fds) if a.pace_fds else None
    opts = Options(n_ctx=a.ctx_size, threads=a.threads, batch=a.batch_size, pager=not a.no_pager,
                   pager_config=None if a.no_pager else _pager_config(a),
                   keep_logits=bool(a.dump_logits or a.tokens_in),
                   kernels=_kernel_path(a))
    engine = Engine(a.model, opts)
    try:
        if a.selftest:
            from .selftest import run_selftests
            run_selftests(engine, a.selftest)
            return 0
        dump = MoEDumpWriter(os.environ["SDQ_MOE_DUMP"]) if os.environ.get("SDQ_MOE_DUMP") else None
        if dump:
            engine.on_moe(dump.write)
        state_dump = StateDumpWriter(os.environ["SDQ_STATE_DUMP"]) if os.environ.get("SDQ_STATE_DUMP") else None
        if state_dump:
            engine.on_state(state_dump.write)
        prefetch_dump = None
        if os.environ.get("SDQ_PREFETCH_DUMP") and engine.options.pager:
            prefetch_dump = PrefetchDumpWriter(os.environ["SDQ_PREFETCH_DUMP"])
            engine.experts.on_prediction = prefetch_dump.write
        try:
            logits = teacher_forced(engine, a.tokens_in) if a.tokens_in else generated(engine, a, pacer)
        except ValueError as e:
            raise ModelError(str(e)) from None
        for d in (dump, state_dump, prefetch_dump):
            if d:
                d.close()
        if a.dump_logits:
            write_logits(a.logits_out, logits)
        records = engine.stats_records()
        if a.stats_file:
            with open(a.stats_file, "a") as f:
                for r in records:
                    f.write(json.dumps(r) + "\n")
        if a.profile_out:
            write_atomic(a.profile_out, engine.experts.profile_text().encode())
        _say_what_was_picked(engine, a, threads_auto)   # after the run: an error stays the one line
        for r in records:
            print(f"[epm] {r['phase']}: {r['tokens']} tok / {r['seconds']:.3f}s = {r['tok_s']:.2f} tok/s",
                  file=sys.stderr)
    finally:
        engine.close()
    return 0


def _say_what_was_picked(engine, a: argparse.Namespace, threads_auto: bool) -> None:
    """One stderr line for the sizes the engine chose itself (no -t, no --ram-budget-mb)."""
    picked = [f"{a.threads} threads (the CPUs this process may use)"] if threads_auto else []
    pager = engine.experts if engine.options.pager else None
    if pager is not None and a.ram_budget_mb is None:
        picked.append(f"RAM budget {pager.budget_mb:,.0f} MiB ({pager.budget_source}), "
                      f"arena {pager.plan.total_bytes / 2**20:,.1f} MiB")
    if picked:
        print("[epm] picked: " + "; ".join(picked), file=sys.stderr)


def generated(engine, a: argparse.Namespace, pacer: "Pacer | None"):
    """The prompt's logits and the generated tokens', the text on stdout; each decode step
    held and timed by `pacer` (--pace-fds) when there is one."""
    tokens = engine.encode_prompt(a.prompt or "", chat=not a.no_chat)
    if not tokens:
        raise ModelError("empty prompt")

    # Tokens can split a UTF-8 character: decode incrementally, invalid bytes as U+FFFD.
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def emit(tok: int) -> None:
        sys.stdout.write(utf8.decode(engine.tokenizer.token_bytes(tok)))
        sys.stdout.flush()

    _, logits = engine.generate(tokens, a.n_predict, a.temp, a.seed, on_token=emit, pacer=pacer)
    if pacer:
        pacer.end()
    sys.stdout.write(utf8.decode(b"", final=True) + "\n")
    return logits


def teacher_forced(engine, path: str):
    """--tokens-in: every position's logits; nothing is generated, so stdout is an empty line."""
    tokens, n_prefill = read_tokens(path, engine.tokenizer.n_vocab)
    logits = engine.teacher_force(tokens, n_prefill)
    sys.stdout.write("\n")
    return logits


def main(argv: list[str] | None = None) -> int:
    try:
        return run(build_parser().parse_args(argv))
    except ModelError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
