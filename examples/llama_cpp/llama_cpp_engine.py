#!/usr/bin/env python3
"""A reference outside engine: llama.cpp (through llama-cpp-python) speaking
docs/engine-contract.md, written from that page alone -- it imports nothing of epmci or of
the bundled engine. No pager, no selftest, no MoE dump: it declares only teacher_forcing,
and the gate skips the suites that need the rest.

    python3 examples/llama_cpp/llama_cpp_engine.py --contract-info
    epmci check --config examples/llama_cpp/epmci.yaml

Needs `pip install llama-cpp-python` (optional: the rest of epmci runs without it). Every
evaluation keeps the logits of all positions (logits_all); the prefill goes in micro-batches
of -b, each decode step alone; flash attention is off (its CPU path accumulates V in f16).
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import os
import struct
import sys
import time

PROG = "llama-cpp-engine"
CONTRACT = 2
N_PREDICT = 32
CHAT_TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
TOKENS_MAGIC = b"EPMT"
ARCHITECTURES = ["qwen3moe", "qwen35moe"]
QUANT_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
               "Q6_K", "Q8_K"]


class Refusal(Exception):
    """What the engine cannot run: one line on stderr, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise Refusal(message)


def parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description="llama.cpp behind the epmci engine contract")
    ap.add_argument("--contract-info", action="store_true")
    ap.add_argument("-m", "--model")
    ap.add_argument("-p", "--prompt")
    ap.add_argument("-n", "--n-predict", type=int)
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-b", "--batch-size", type=int, default=32)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-chat", action="store_true")
    ap.add_argument("--no-interactive", action="store_true")
    ap.add_argument("--stats-file")
    ap.add_argument("--dump-logits", action="store_true")
    ap.add_argument("--logits-out")
    ap.add_argument("--tokens-in")
    return ap


def contract_info() -> dict:
    try:
        from importlib.metadata import version
        v = version("llama-cpp-python")
    except Exception:       # not installed: it still says what it is
        v = "unknown"
    return {"contract": CONTRACT, "engine": {"name": PROG, "version": v}, "architectures": ARCHITECTURES,
            "quant_types": QUANT_TYPES, "features": ["teacher_forcing"]}


@contextlib.contextmanager
def quiet_stderr():
    """llama.cpp logs to stderr from C; the contract allows one line there, ours."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def memory_mib(key: str) -> float:
    """VmHWM / VmSwap of this process in MiB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


class Engine:
    def __init__(self, a: argparse.Namespace):
        import llama_cpp
        import numpy as np
        self.np, self.llama_cpp, self.a = np, llama_cpp, a
        if not os.path.isfile(a.model):
            raise Refusal(f"{a.model}: no such model file")
        try:
            with quiet_stderr():
                self.llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.ctx_size, n_batch=a.batch_size,
                                           n_ubatch=a.batch_size, n_threads=a.threads, n_threads_batch=a.threads,
                                           logits_all=True, flash_attn=False, seed=a.seed, verbose=False)
        except (ValueError, RuntimeError) as e:
            raise Refusal(f"{a.model}: llama.cpp cannot load it ({str(e).splitlines()[0]})") from None
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.phases: dict[str, dict] = {}

    def eval(self, tokens: list[int], phase: str):
        """Evaluate tokens after the ones so far; their logits rows."""
        start = self.llm.n_tokens
        t0 = time.perf_counter()
        with quiet_stderr():
            self.llm.eval(tokens)
        p = self.phases.setdefault(phase, {"tokens": 0, "seconds": 0.0})
        p["tokens"] += len(tokens)
        p["seconds"] += time.perf_counter() - t0
        return self.np.array(self.llm.scores[start:start + len(tokens)], dtype=self.np.float32)

    def tokenize(self, text: str) -> list[int]:
        # the contract's Prompt: special tokens parsed, no BOS whatever the model asks for
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def sample(self, row, rng) -> int:
        np = self.np
        if self.a.temp <= 0:
            return int(np.argmax(row))
        z = row.astype(np.float64) / self.a.temp
        p = np.exp(z - z.max())
        return int(rng.choice(len(p), p=p / p.sum()))

    def generate(self, tokens: list[int]):
        """Prefill, then greedy (or sampled) decode: the logits of every evaluated position,
        the generated text on stdout."""
        np, n = self.np, self.a.n_predict
        if len(tokens) + n > self.a.ctx_size:
            raise Refusal(f"-n {n}: the {len(tokens)}-token prompt + {n} tokens exceed -c {self.a.ctx_size}")
        rows = [self.eval(tokens, "prefill")]
        rng = np.random.default_rng(self.a.seed)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for i in range(n):
            tok = self.sample(rows[-1][-1], rng)
            sys.stdout.write(utf8.decode(self.llm.detokenize([tok], special=True)))
            if self.llama_cpp.llama_vocab_is_eog(self.vocab, tok) or i == n - 1:
                break
            rows.append(self.eval([tok], "decode"))
        sys.stdout.write(utf8.decode(b"", final=True) + "\n")
        return np.concatenate(rows)

    def teacher_force(self, path: str):
        tokens, n_prefill = read_tokens(path, self.llm.n_vocab())
        if len(tokens) > self.a.ctx_size:
            raise Refusal(f"--tokens-in {path}: {len(tokens)} tokens exceed -c {self.a.ctx_size}")
        rows = [self.eval(tokens[:n_prefill], "prefill")] + [self.eval([t], "decode") for t in tokens[n_prefill:]]
        sys.stdout.write("\n")
        return self.np.concatenate(rows)

    def records(self) -> list[dict]:
        out = []
        for phase in ("prefill", "decode"):
            p = self.phases.get(phase)
            if p and p["tokens"]:
                s = p["seconds"]
                out.append({"phase": phase, "tokens": p["tokens"], "seconds": round(s, 6),
                            "tok_s": round(p["tokens"] / s, 4) if s > 0 else 0.0,
                            "peak_rss_mb": memory_mib("VmHWM"), "vm_swap_mb": memory_mib("VmSwap")})
        return out


def read_tokens(path: str, n_vocab: int) -> tuple[list[int], int]:
    try:
        b = open(path, "rb").read()
    except OSError as e:
        raise Refusal(f"--tokens-in {path}: {e.strerror}") from None
    if len(b) < 16 or b[:4] != TOKENS_MAGIC:
        raise Refusal(f"--tokens-in {path}: not a tokens file")
    version, n, n_prefill = struct.unpack_from("<3I", b, 4)
    if version != 1 or len(b) != 16 + 4 * n or not 1 <= n_prefill <= n:
        raise Refusal(f"--tokens-in {path}: version {version}, {n} tokens, n_prefill {n_prefill}, {len(b)} bytes")
    tokens = list(struct.unpack_from(f"<{n}i", b, 16))
    if any(not 0 <= t < n_vocab for t in tokens):
        raise Refusal(f"--tokens-in {path}: a token id outside the vocabulary (0..{n_vocab - 1})")
    return tokens, n_prefill


def run(a: argparse.Namespace) -> int:
    if a.contract_info:
        print(json.dumps(contract_info()))
        return 0
    if not a.model:
        raise Refusal("-m/--model: a model file is required")
    if a.tokens_in and (a.prompt is not None or a.n_predict is not None):
        raise Refusal("--tokens-in: the tokens are given, so -p and -n do not apply")
    a.n_predict = N_PREDICT if a.n_predict is None else a.n_predict
    for flag, v, lo in (("-n", a.n_predict, 0), ("-c", a.ctx_size, 1), ("-t", a.threads, 1), ("-b", a.batch_size, 1)):
        if v < lo:
            raise Refusal(f"{flag}: must be >= {lo}, got {v}")
    if a.dump_logits and not a.logits_out:
        raise Refusal("--dump-logits: --logits-out PATH is required")
    eng = Engine(a)
    if a.tokens_in:
        logits = eng.teacher_force(a.tokens_in)
    else:
        text = a.prompt or ""
        tokens = eng.tokenize(text if a.no_chat else CHAT_TEMPLATE.format(prompt=text))
        if not tokens:
            raise Refusal("-p: empty prompt")
        logits = eng.generate(tokens)
    if a.dump_logits:
        tmp = a.logits_out + ".tmp"
        with open(tmp, "wb") as f:
            f.write(struct.pack("<i", logits.shape[1]) + logits.astype("<f4").tobytes())
        os.replace(tmp, a.logits_out)
    if a.stats_file:
        with open(a.stats_file, "a") as f:
            for r in eng.records():
                f.write(json.dumps(r) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(parser().parse_args(argv))
    except Refusal as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
