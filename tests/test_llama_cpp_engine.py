"""The reference outside engine (examples/llama_cpp/: llama.cpp speaking docs/engine-contract.md,
written from the page): the gate runs every suite it can take part in, skips the rest saying
which feature it lacks, passes the conformance suite, and fails broken copies of it -- one
ignoring --no-chat, one adding a BOS token, one reversing every logits row -- through the
model suite with a message naming the fault. Skipped, with the reason shown, where
llama-cpp-python is not installed (CI has none)."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from epmci.cli import main as epmci_main
from faults import results, run_check, statuses

pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (see examples/llama_cpp/README.md)")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "llama_cpp"
ENGINE = f"{shlex.quote(sys.executable)} {shlex.quote(str(EXAMPLE / 'llama_cpp_engine.py'))}"
CONFIG = ("--config", str(EXAMPLE / "epmci.yaml"))


def copy_of_it(tmp_path, patch: str) -> str:
    """A broken copy of the outside engine: its module, one thing patched, its main()."""
    script = tmp_path / "broken_llama_cpp_engine.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(EXAMPLE)!r})\nimport llama_cpp_engine as E\n"
                      + textwrap.dedent(patch) + "\nsys.exit(E.main())\n")
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def test_the_gate_runs_what_the_outside_engine_can_take_and_skips_the_rest(tmp_path, tiny_model):
    rc, rep = run_check(tmp_path, tiny_model, ENGINE, *CONFIG, "--set",
                        "suites=[contract, kernel, layer, prefetch-stress, determinism, e2e, model, switches, budget, perf]")
    assert rc == 0, rep
    for suite, feature in (("kernel", "pager, selftest"), ("layer", "moe_dump"), ("prefetch-stress", "pager, moe_dump"),
                           ("e2e", "pager"), ("switches", "pager, moe_dump"), ("budget", "pager")):
        (r,) = results(rep, suite)
        assert r["status"] == "skip" and r["message"].startswith(f"engine lacks {feature} "), (suite, r["message"])
    det = statuses(rep, "determinism")          # no pager: no paging counters to replay
    assert det.pop("default settings: counters replayed") == "skip" and set(det.values()) == {"pass"}, det
    prompt, decode = results(rep, "model")
    assert prompt["status"] == decode["status"] == "pass" and decode["properties"]["teacher_forced"]
    assert prompt["properties"]["prompt_argmax_agree"] == prompt["properties"]["prompt_tokens"]
    contract = statuses(rep, "contract")
    skipped = {n for n, s in contract.items() if s == "skip"}
    assert skipped == {"bad SDQ_* value", "arena below the minimum", "--no-pager stats", "selftest out of range",
                       "MoE dump", "routing profile", "pacing"}
    assert all(s == "pass" for n, s in contract.items() if n not in skipped), contract
    perf = {r["name"]: r for r in results(rep, "perf")}
    assert perf["baseline: peak RSS"]["status"] == "pass"
    assert "no golden baseline" in perf["baseline: counters"]["message"]       # its own baselines: none recorded
    assert rep["meta"]["engine_contract"]["name"] == "llama-cpp-engine"


def test_the_outside_engine_passes_on_the_defaults(tmp_path, tiny_model, monkeypatch):
    """No settings file, no --set: an engine that is not bit-exact is compared within the
    default tolerance and teacher-forced, and passes `epmci check --fast` and `epmci
    contract-test` -- as a new user's first run would."""
    monkeypatch.chdir(tmp_path)                   # no epmci.yaml here or above: built-in defaults
    rc, rep = run_check(tmp_path, tiny_model, ENGINE, "--fast")
    failed = {(s["name"], r["name"]): r["message"] for s in rep["suites"] for r in s["results"] if r["status"] != "pass"
              and r["status"] != "skip"}
    assert rc == 0 and not failed, failed
    assert rep["meta"]["config"] == "<defaults>"
    prompt, decode = results(rep, "model")
    assert prompt["properties"]["mode"] == "kl" and decode["properties"]["teacher_forced"]
    out = tmp_path / "contract.json"
    rc = epmci_main(["contract-test", "--model", str(tiny_model), "--engine-cmd", ENGINE, "-q", "--json", str(out),
                     "--workdir", str(tmp_path / "ct")])
    rep = json.loads(out.read_text())
    assert rc == 0, {r["name"]: r["message"] for r in results(rep, "contract") if r["status"] == "fail"}
    assert {"tokenization", "chat template"} <= {n for n, st in statuses(rep, "contract").items() if st == "pass"}


@pytest.mark.parametrize("patch, fault, where", [
    ("""
        sys.argv = [a for a in sys.argv if a != "--no-chat"]
    """, "ignores --no-chat", "does not evaluate the prompt it was given"),
    ("""
        good = E.Engine.tokenize
        E.Engine.tokenize = lambda self, text: [self.llm.token_bos()] + good(self, text)
    """, "adds a BOS token", "does not evaluate the prompt it was given"),
    ("""
        good = E.Engine.eval
        E.Engine.eval = lambda self, tokens, phase: good(self, tokens, phase)[:, ::-1].copy()
    """, "reverses every logits row", "differ from the reference (kl <= 0.01): first at position 0"),
])
def test_broken_copies_of_the_outside_engine_fail_the_model_suite(tmp_path, tiny_model, patch, fault, where):
    """Each passed determinism and e2e 8/8 before (comparing the engine with itself); the
    model suite compares it with the reference and names the fault. The conformance suite's
    tokenization item points at the same fault."""
    rc, rep = run_check(tmp_path, tiny_model, copy_of_it(tmp_path, patch), *CONFIG, "--suites", "model,contract",
                        "--set", "contract.items=[tokenization]")
    assert rc == 1, fault
    prompt = results(rep, "model")[0]
    assert prompt["status"] == "fail" and where in prompt["message"], (fault, prompt["message"])
    (tok,) = results(rep, "contract")
    assert tok["status"] == "fail", (fault, tok["message"])
    if "BOS" in fault or "--no-chat" in fault:
        assert "the engine evaluated" in tok["message"] and "prompt positions" in tok["message"]
    else:
        assert "differ from the reference's on the contract's tokens" in tok["message"]


def test_compare_the_outside_engine_with_the_bundled_one(tmp_path, tiny_model, built_engine, capsys):
    js = tmp_path / "c.json"
    rc = epmci_main(["compare", "--model", str(tiny_model), "--engine-cmd", ENGINE, "--positions", "48",
                     "--decode", "8", "--json", str(js)])
    out = capsys.readouterr().out
    d = json.loads(js.read_text())
    assert rc == 0, out
    assert d["names"] == ["epm-engine", "llama-cpp-engine"] and d["summary"]["top1_agreement"] == 1.0
    assert 0 < d["summary"]["kl_max"] < 1e-2 and len(d["positions"]) == 56
