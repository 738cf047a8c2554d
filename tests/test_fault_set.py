"""The project's fault set (tests/faults.py FAULT_SET) and the bench that runs it across
generated shapes (bench/fault_shapes.py): every fault still patches the engine it was written
for, and a cell is called MISSED only when the broken copy behaves otherwise than the correct
engine in some probe run."""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
from pathlib import Path

import pytest

from faults import FAULT_SET, broken_engine

BENCH = Path(__file__).resolve().parent.parent / "bench" / "fault_shapes.py"


def bench():
    spec = importlib.util.spec_from_file_location("fault_shapes", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("fault", list(FAULT_SET))
def test_every_fault_of_the_set_loads_into_a_copy_of_the_engine(tmp_path, fault):
    """A patch naming what the engine no longer has would make a 'caught' cell mean nothing."""
    proc = subprocess.run([*shlex.split(broken_engine(tmp_path, FAULT_SET[fault].patch)), "--contract-info"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and '"contract"' in proc.stdout, proc.stderr[-500:]


def run_print(**kw) -> dict:
    return {"exit": 0, "error": "", "dumps": {"logits.bin": "aa", "moe.0": "bb"},
            "stats": [{"phase": "prefill", "hits": 3}, {"phase": "decode", "hits": 5}], "peak_rss_mb": 200.0} | kw


def test_a_cell_differs_only_where_the_broken_copy_behaves_otherwise():
    F = bench()
    same = {"default": run_print(), "-t 3": run_print()}
    assert F.difference(same, {k: run_print() for k in same}) is None
    assert F.difference(same, {"default": run_print(peak_rss_mb=214.0), "-t 3": run_print()}) is None   # noise
    assert "peak RSS 300 MiB" in F.difference(same, {"default": run_print(peak_rss_mb=300.0), "-t 3": run_print()})
    assert F.difference(same, {"default": run_print(), "-t 3": run_print(dumps={"logits.bin": "ff", "moe.0": "bb"})}) \
        == "-t 3: logits.bin differs"
    assert "decode stats differ in hits 6 (correct 5)" in F.difference(
        same, {"default": run_print(stats=[{"phase": "prefill", "hits": 3}, {"phase": "decode", "hits": 6}]),
               "-t 3": run_print()})
    assert "exit 2 (short read)" in F.difference(same, {"default": run_print(exit=2, error="short read"),
                                                        "-t 3": run_print()})


def test_the_table_counts_caught_of_the_cells_that_could_expose_their_fault():
    F = bench()
    shape = {"arch": "qwen3moe", "layers": 2, "experts": 8, "used": 2, "embd": 256, "ff": 256, "heads": 4,
             "kv_heads": 4, "head_dim": 64, "vocab": 512, "ctx": 256, "q6k_down_layers": []}
    a, b = list(FAULT_SET)[:2]
    recs = [{"seed": 0, "shape": shape, "fault": a, "verdict": "caught", "why": "", "commit": "1" * 40},
            {"seed": 1, "shape": shape, "fault": a, "verdict": "cannot", "why": "no probe run differs", "commit": "1" * 40},
            {"seed": 0, "shape": shape, "fault": b, "verdict": "MISSED", "why": "default: logits.bin differs",
             "commit": "2" * 40}]
    md = F.render(recs)
    assert "caught 1 of 2 that could expose their fault, missed 1, errors 0, cannot be exposed 1" in md
    assert "Recorded at 1111111 (2 cells), 2222222 (1 cells)" in md
    assert f"| {a} | {FAULT_SET[a].kind} | C | · |" in md and f"| {b} | {FAULT_SET[b].kind} | **M** |   |" in md
    assert f"- {b} on shape 0: MISSED: default: logits.bin differs" in md
