#!/usr/bin/env python3
"""Where a decoded token's time goes: per op and per matrix, resident engine (--no-pager).

    python bench/profile.py [--preset ci|bench] [--threads 1] [--n-predict 32] [--json OUT]

One in-process engine: the prompt is prefilled, then --n-predict tokens are decoded
greedily with timers around every call the forward pass makes into engine.kernels
(matmul per weight matrix, activation quantization, dequantization) and engine.ops
(norms, RoPE, attention, softmax, SwiGLU). The timers wrap the module attributes the
forward looks up, so the engine's code is unchanged; their own cost (two perf_counter
calls per op) is inside "Python between ops". Matmul rows include the activation
quantization they trigger (also shown on its own row). Printed: a Markdown table, ms per
decoded token and share of the decode time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import engine.kernels as K  # noqa: E402
import engine.deltanet as DN  # noqa: E402
import engine.ops as O  # noqa: E402
import engine.qwen35moe as Q  # noqa: E402
from engine.qtypes import QTYPES  # noqa: E402
from engine.runtime import Engine, Options  # noqa: E402
from epmci.synth.store import make_model  # noqa: E402
from headline import PROMPT  # noqa: E402  (the bench prompt, one place: bench/headline.py)

OPS = ("rms_norm", "rms_norm_heads", "rope_neox", "attention_probs", "attention_values", "softmax", "swiglu")
# qwen35moe's own ops, looked up in engine.qwen35moe's namespace and engine.deltanet's
QWEN35_OPS = ("rms_norm", "rms_norm_heads", "l2_norm_heads", "sigmoid", "silu", "softplus")
DELTANET_OPS = ("causal_conv", "gated_delta_rule")


class Timers:
    def __init__(self):
        self.on = False
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, label, fn):
        def timed(*args, **kw):
            if not self.on:
                return fn(*args, **kw)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                key = label(*args) if callable(label) else label
                self.seconds[key] += time.perf_counter() - t0
                self.calls[key] += 1
        return timed


def matrix_names(eng: Engine) -> dict[int, str]:
    """id of each dense weight array -> its role (layer number dropped)."""
    out = {}
    for name, t in eng.gm.tensors.items():
        if "_exps." not in name:
            out[id(t.data)] = name.split(".", 2)[-1].removesuffix(".weight") if name.startswith("blk.") \
                else name.removesuffix(".weight")
    return out


def instrument(eng: Engine, timers: Timers) -> None:
    names = matrix_names(eng)

    def mm_label(ws, qtype, a, rows_of):
        role = names.get(id(ws[0]), "experts")
        return f"matmul {role} {QTYPES[int(qtype)].name} {ws[0].shape[0]}x{a.x.shape[1]}"

    K.matmul_rows = timers.wrap(mm_label, K.matmul_rows)
    K.dequantize_rows = timers.wrap("dequantize_rows (embedding)", K.dequantize_rows)
    quantized = K.Activation.quantized
    K.Activation.quantized = timers.wrap(lambda self, t: f"  of which quantize to {'Q8_K' if t == 15 else QTYPES[t].name}",
                                         quantized)
    for op in OPS:
        setattr(O, op, timers.wrap(op, getattr(O, op)))
    for op in QWEN35_OPS:
        setattr(Q, op, timers.wrap(f"qwen35 {op}", getattr(Q, op)))
    for op in DELTANET_OPS:
        setattr(DN, op, timers.wrap(f"deltanet {op}", getattr(DN, op)))


def profile(model: str, threads: int, n_predict: int) -> dict:
    eng = Engine(model, Options(n_ctx=512, threads=threads, batch=32, pager=False))
    timers = Timers()
    instrument(eng, timers)
    toks = eng.encode_prompt(PROMPT, chat=False)
    last = eng.eval(toks, "prefill")[-1]
    eng.eval([int(np.argmax(last))], "decode")      # first decode step: warm caches
    t0 = time.perf_counter()
    timers.on = True
    for _ in range(n_predict):
        last = eng.eval([int(np.argmax(last))], "decode")[-1]
    timers.on = False
    wall = time.perf_counter() - t0
    eng.close()
    rows = {k: v for k, v in timers.seconds.items()}
    timed = sum(v for k, v in rows.items() if not k.startswith("  "))
    return {"model": model, "threads": threads, "n_predict": n_predict, "decode_s": wall,
            "tok_s": n_predict / wall, "rows": rows, "calls": dict(timers.calls),
            "python_between_ops_s": wall - timed}


def render(p: dict) -> str:
    n, wall = p["n_predict"], p["decode_s"]
    lines = [f"{Path(p['model']).name}, -t {p['threads']}: {p['tok_s']:.2f} tok/s, "
             f"{1000 * wall / n:.2f} ms per decoded token", "",
             "| op | calls/token | ms/token | share |", "|---|---:|---:|---:|"]
    order = sorted((k for k in p["rows"] if not k.startswith("  ")), key=lambda k: -p["rows"][k])
    for k in order + sorted(k for k in p["rows"] if k.startswith("  ")) + ["Python between ops"]:
        s = p["python_between_ops_s"] if k == "Python between ops" else p["rows"][k]
        c = "" if k == "Python between ops" else f"{p['calls'][k] / n:.0f}"
        lines.append(f"| {k} | {c} | {1000 * s / n:.3f} | {100 * s / wall:.1f} % |")
    return "\n".join(lines)


def group(key: str) -> str:
    """A profile row -> its row in the summary table."""
    if key.startswith("matmul"):
        role, qtype = key.split()[1:3]
        if role in ("expert", "experts"):
            return f"matmul experts {qtype}"
        return {"ffn_gate_inp": "matmul router (F32)", "output": "matmul output head"}.get(role, "matmul attention q/k/v/o")
    if key.startswith("attention"):
        return "attention (probs, values)"
    if key.startswith("deltanet"):
        return "delta net (conv, recurrence)"
    if key.startswith("  of which"):
        return "  of which activation quantization"
    return "norms, RoPE, softmax, SwiGLU, embedding"


def summary(profiles: list[dict]) -> str:
    """Shares of decode time per group, one column per profile (--table)."""
    cols = [f"{Path(p['model']).name.split('-')[0]} -t {p['threads']}" for p in profiles]
    shares = []
    for p in profiles:
        g: dict[str, float] = defaultdict(float)
        for k, v in p["rows"].items():
            g[group(k)] += v
        g["Python between ops"] = p["python_between_ops_s"]
        shares.append({k: 100 * v / p["decode_s"] for k, v in g.items()})
    names = sorted({k for sh in shares for k in sh}, key=lambda k: (k.startswith(("  ", "Python")), -shares[-1].get(k, 0)))
    lines = ["| share of decode time | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for k in names:
        lines.append(f"| {k} | " + " | ".join(f"{sh.get(k, 0):.1f} %" for sh in shares) + " |")
    lines.append("| ms per decoded token | " + " | ".join(f"{1000 * p['decode_s'] / p['n_predict']:.1f}" for p in profiles) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="ci")
    ap.add_argument("--model", help="a GGUF file instead of a preset")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the summary table of --json files and exit")
    a = ap.parse_args()
    if a.table:
        print(summary([json.loads(Path(f).read_text()) for f in a.table]))
        return 0
    p = profile(a.model or str(make_model(a.preset)), a.threads, a.n_predict)
    if a.json:
        Path(a.json).write_text(json.dumps(p, indent=1))
    print(render(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
