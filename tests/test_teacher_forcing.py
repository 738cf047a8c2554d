"""Teacher forcing (docs/engine-contract.md, --tokens-in): an engine evaluates a given token
sequence -- a prefill, then each later token alone as a decode step -- and writes every
position's logits. The bundled engine's are byte-identical to the run that generated those
tokens; the model suite feeds an external engine the reference's tokens this way; and
`epmci compare` puts two engines on the same tokens position by position."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from epmci.cli import main as epmci_main
from epmci.contract.inputs import tokens_file, write_tokens
from epmci.contract.outputs import read_logits
from epmci.gguf.file import ModelFile
from epmci.reference.tokenizer import ReferenceTokenizer
from epmci.compare.logits import LogitsRule
from epmci.config.schema import ModelSuiteConfig
from faults import broken_engine, results, run_check

PROMPT = "Experts are read from the disk into a fixed arena."


def engine(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *map(str, args)], capture_output=True, text=True,
                          check=check, timeout=300)


def stats(path) -> dict:
    return {r["phase"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_forced_logits_are_the_generating_runs_bit_for_bit(tiny_model, tmp_path):
    a, sa = tmp_path / "a.bin", tmp_path / "a.jsonl"
    engine("-m", tiny_model, "-p", PROMPT, "-n", 5, "-b", 4, "--no-chat", "--dump-logits", "--logits-out", a,
           "--stats-file", sa)
    rows = read_logits(a)
    ids = ReferenceTokenizer.of(ModelFile(tiny_model)).encode(PROMPT)
    P = len(ids)
    fed = [int(t) for t in rows[P - 1:-1].argmax(1)]          # the generated tokens that were fed back
    write_tokens(tmp_path / "t.bin", ids + fed, P)
    b, sb = tmp_path / "b.bin", tmp_path / "b.jsonl"
    r = engine("-m", tiny_model, "--tokens-in", tmp_path / "t.bin", "-b", 4, "--dump-logits", "--logits-out", b,
               "--stats-file", sb)
    assert r.stdout == "\n"                                      # nothing generated
    assert read_logits(b).tobytes() == rows.tobytes() and rows.shape[0] == P + 4
    s = stats(sb)
    assert s["prefill"]["tokens"] == P and s["decode"]["tokens"] == 4
    assert {k: v for k, v in s["decode"].items() if k in ("hits", "misses", "evictions")} == \
           {k: v for k, v in stats(sa)["decode"].items() if k in ("hits", "misses", "evictions")}


@pytest.mark.parametrize("case, words", [
    ("prompt too", "-p and -n do not apply"),
    ("truncated", "bytes of tokens, expected"),
    ("magic", "not a tokens file"),
    ("prefill 0", "n_prefill 0 must be in 1..n_tokens"),
    ("token id", "is not in the vocabulary"),
    ("missing", "No such file"),
    ("too long", "exceed context"),
])
def test_a_bad_tokens_file_is_one_line_exit_2(tiny_model, tmp_path, case, words):
    f = tmp_path / "t.bin"
    good = tokens_file([1, 2, 3, 4], 2)
    data = {"truncated": good[:-1], "magic": b"XXXX" + good[4:],
            "prefill 0": good[:12] + (0).to_bytes(4, "little") + good[16:],
            "token id": tokens_file([1, 2, 99999], 1), "too long": tokens_file(list(range(20)), 3)}.get(case, good)
    if case != "missing":
        f.write_bytes(data)
    extra = ["-p", "hi"] if case == "prompt too" else ["-c", 16] if case == "too long" else []
    r = engine("-m", tiny_model, "--tokens-in", f, *extra, check=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert words in lines[0] and (case in ("prompt too", "too long") or str(f) in lines[0]), lines[0]


# ----------------------------------------------------------------- the model suite, teacher-forced

pytestmark_built = pytest.mark.usefixtures("built_engine")
KL = ("--suites", "model")      # an engine without reference_exact: compared within model_suite.max_kl


@pytestmark_built
def test_model_suite_feeds_an_external_engine_the_reference_tokens(tmp_path, tiny_model):
    rc, rep = run_check(tmp_path, tiny_model, broken_engine(tmp_path, "", reference_exact=False), *KL)
    assert rc == 0, rep
    prompt, decode = results(rep, "model")
    assert prompt["properties"]["teacher_forced"] and "byte-identical" in decode["message"]
    assert "teacher-forced" in decode["message"] and decode["properties"]["decode_steps"] == 8


@pytestmark_built
@pytest.mark.parametrize("fault, max_kl, words", [
    # every --tokens-in token evaluated as the prefill: no decode step ran
    ("""
        import engine.runtime as R
        R.Engine.teacher_force = lambda self, tokens, n_prefill: self.eval(tokens, "prefill")
    """, ModelSuiteConfig().max_kl, "evaluated {all} prefill + 0 decode positions"),
    # decode steps rotated as if at position 0. On tiny its KL (8.4e-4 at most) is at
    # llama.cpp's own rounding noise there (8.3e-4): the default 0.01 cannot see it, a bound
    # of 1e-4 can (docs/CORRECTNESS.md, Tolerance for engines that are not bit-exact)
    ("""
        import engine.ops as O
        good = O.rope_cache
        O.rope_cache = lambda positions, d, base: good(positions * 0 if len(positions) == 1 else positions, d, base)
    """, 1e-4, "teacher-forced differ from the reference ({rule}): first at position {first_decode} (decode step 1)"),
])
def test_a_forced_decode_fault_fails_decode_positions(tmp_path, tiny_model, fault, max_kl, words):
    rc, rep = run_check(tmp_path, tiny_model, broken_engine(tmp_path, fault, reference_exact=False), *KL,
                        "--set", f"model_suite.max_kl={max_kl}")
    st = {r["name"]: (r["status"], r["message"]) for r in results(rep, "model")}
    assert rc == 1 and st["prompt positions"][0] == "pass", st
    P = results(rep, "model")[0]["properties"]["prompt_tokens"]
    words = words.format(all=P + 8, first_decode=P, rule=LogitsRule("kl", max_kl).text())
    assert st["decode positions"][0] == "fail" and words in st["decode positions"][1], st


# ----------------------------------------------------------------- epmci compare

@pytestmark_built
def test_compare_two_engines_position_by_position(tmp_path, tiny_model, capsys):
    """The bundled engine against a copy whose decode-step logits are off at one position:
    the copy is the same engine up to there, so exactly that position is named."""
    same = broken_engine(tmp_path, "", "same.py")
    js = tmp_path / "c.json"
    rc = epmci_main(["compare", "--model", str(tiny_model), "--engine-cmd", same, "--positions", "24",
                     "--decode", "4", "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0 and "top-1 agreement 28/28" in out and "PASS" in out, out
    d = json.loads(js.read_text())
    assert d["summary"]["kl_max"] == 0 and len(d["positions"]) == 28 and d["positions"][24]["phase"] == "decode"
    off = broken_engine(tmp_path, """
        import engine.runtime as R
        good = R.Engine.eval
        def evaluate(self, tokens, phase="prefill", *rest):
            rows = good(self, tokens, phase, *rest)
            if phase == "decode" and self.model.n_past == 27:      # the decode step at position 26
                rows = rows[:, ::-1].copy()
            return rows
        R.Engine.eval = evaluate
    """, "off.py")
    rc = epmci_main(["compare", "--model", str(tiny_model), "--engine-cmd", same, "--engine-cmd", off,
                     "--positions", "24", "--decode", "4", "--json", str(js)])
    out = capsys.readouterr().out
    d = json.loads(js.read_text())
    assert rc == 1 and "FAIL" in out and d["summary"]["first_disagreement"] == 26, out
    assert d["summary"]["kl_max_position"] == 26 and [p["agree"] for p in d["positions"]].count(False) == 1


def test_compare_refuses_an_engine_without_teacher_forcing(tmp_path, tiny_model, capsys):
    cmd = broken_engine(tmp_path, """
        import engine.contract_info as CI
        CI.FEATURES = ("pager",)
    """)
    rc = epmci_main(["compare", "--model", str(tiny_model), "--engine-cmd", cmd])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "engine lacks teacher_forcing" in err[0], err
