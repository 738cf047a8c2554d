"""The conformance suite (`epmci contract-test`, the `contract` suite): every documented
behaviour of docs/engine-contract.md probed and reported per item. It passes on the bundled
engine; copies of it that each get one sentence of the contract wrong fail the item of that
sentence, with a message that says what the contract wanted. (The reference outside engine
passes it too: tests/test_llama_cpp_engine.py.)"""

from __future__ import annotations

import pytest

from epmci.cli import main as epmci_main
from faults import broken_engine, results

pytestmark = pytest.mark.usefixtures("built_engine")


def contract_test(tmp_path, model, engine_cmd, *args) -> tuple[int, dict]:
    import json
    out = tmp_path / "report.json"
    argv = ["contract-test", "--model", str(model), "--json", str(out), "-q", "--workdir", str(tmp_path / "w"),
            "--no-build", *args]
    if engine_cmd:
        argv += ["--engine-cmd", engine_cmd]
    rc = epmci_main(argv)
    return rc, json.loads(out.read_text())


def test_the_bundled_engine_speaks_the_contract(tmp_path, tiny_model):
    rc, rep = contract_test(tmp_path, tiny_model, None)
    res = {r["name"]: r for r in results(rep, "contract")}
    assert rc == 0, {n: r["message"] for n, r in res.items() if r["status"] != "pass"}
    assert len(res) == 24 and all(r["status"] == "pass" for n, r in res.items() if n != "flags of undeclared features")
    assert res["flags of undeclared features"]["status"] == "skip"     # it declares every feature with a flag
    assert "logits and text = the unpaced run's" in res["pacing"]["message"]
    assert [s["name"] for s in rep["suites"]] == ["contract"]
    assert res["contract-info"]["properties"]["features"] == ["moe_dump", "pacing", "pager", "prefetch_dump",
                                                               "profile", "reference_exact", "selftest",
                                                               "selftest_batch", "state_dump", "teacher_forcing"]
    assert "byte for byte" in res["teacher forcing"]["message"]
    assert "exact" in res["tokenization"]["message"] and "exact" in res["chat template"]["message"]


@pytest.mark.parametrize("fault, item, words", [
    ("""
        import argparse
        engine.cli.ArgumentParser.error = argparse.ArgumentParser.error     # usage text, then the error
    """, "unknown flag", "exactly one line on stderr expected, got "),
    ("""
        import engine.runtime as R
        R.CHAT_TEMPLATE = "<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n\\n"
    """, "chat template", "must evaluate the contract's template"),
    ("""
        import engine.runtime as R
        good = R.Engine.encode_prompt
        R.Engine.encode_prompt = lambda self, prompt, chat: (good(self, prompt, chat) if chat else
                                                             self.tokenizer.encode(prompt, parse_special=False))
    """, "tokenization", "special tokens parsed, no BOS), the engine evaluated"),
    ("""
        import engine.tokenizer as T
        T.Tokenizer.is_eog = lambda self, token_id: False
    """, "end of generation", "generation must end after it"),
    ("""
        good = engine.cli.generated
        def generated(engine_, a, *rest):
            sys.stdout.write(a.prompt or "")          # echoes the prompt, as llama-cli does
            return good(engine_, a, *rest)
        engine.cli.generated = generated
    """, "generated text", "stdout must be the generated tokens' text and a newline"),
    ("""
        import engine.stats as S
        good = S.PhaseStats.record
        def record(self):
            r = good(self)
            if r["phase"] == "decode":
                r["tokens"] += 1                      # the generated tokens, not the decode steps
            return r
        S.PhaseStats.record = record
    """, "stats semantics", "are G - 1 = 3 decode steps"),
    ("""
        import engine.runtime as R
        good = R.Engine.stats_records
        R.Engine.stats_records = lambda self: (good(self) + [{**good(self)[0], "phase": "decode", "tokens": 0}]
                                               if len(good(self)) == 1 else good(self))
    """, "-n 1", "with no decode step there is no decode record"),
    ("""
        import engine.runtime as R
        R.Engine.teacher_force = lambda self, tokens, n_prefill: self.eval(tokens, "prefill")
    """, "teacher forcing", "the stats count 55 prefill + 0 decode"),
    # without --dump-logits it generates one token less (an output flag changing the run)
    ("""
        if "--dump-logits" not in sys.argv and "-n" in sys.argv:
            i = sys.argv.index("-n") + 1
            sys.argv[i] = str(int(sys.argv[i]) - 1)
    """, "output flags change nothing", "an output flag changed the run"),
    # declares no pager, but takes --arena-mb quietly (and ignores it)
    ("""
        import engine.contract_info as CI
        CI.FEATURES = tuple(f for f in CI.FEATURES if f != "pager")
    """, "flags of undeclared features", "--arena-mb (feature pager, not declared): exit 2 expected"),
    # declares several selftests per run but no selftest at all
    ("""
        import engine.contract_info as CI
        CI.FEATURES = tuple(f for f in CI.FEATURES if f != "selftest")
    """, "contract-info", "declares selftest_batch without selftest"),
    # declares the selftest but no pager, which it needs
    ("""
        import engine.contract_info as CI
        CI.FEATURES = tuple(f for f in CI.FEATURES if f != "pager")
    """, "contract-info", "declares selftest without pager"),
    # paced, it numbers its steps from 0
    ("""
        good = engine.cli.Pacer._send
        engine.cli.Pacer._send = lambda self, **r: good(self, **({**r, "step": r["step"] - 1} if "step" in r else r))
    """, "pacing", "the pacing protocol"),
])
def test_an_engine_getting_one_sentence_wrong_fails_its_item(tmp_path, tiny_model, fault, item, words):
    rc, rep = contract_test(tmp_path, tiny_model, broken_engine(tmp_path, fault), "--items", item)
    (r,) = results(rep, "contract")
    assert rc == 1 and r["status"] == "fail" and words in r["message"], r["message"]


def test_an_engine_without_a_pager_gets_the_pager_items_skipped_and_the_rest_probed(tmp_path, tiny_model):
    """Items of a feature the engine does not declare are SKIPs saying so, never dropped; the
    stats items ask only for the fields of an engine without a pager."""
    from test_capabilities import NO_PAGER
    rc, rep = contract_test(tmp_path, tiny_model, broken_engine(tmp_path, NO_PAGER), "--items",
                            "contract-info,stats fields,bad SDQ_* value,selftest out of range")
    res = {r["name"]: r for r in results(rep, "contract")}
    assert rc == 0, {n: r["message"] for n, r in res.items()}
    assert {n: r["status"] for n, r in res.items()} == {"contract-info": "pass", "stats fields": "pass",
                                                       "bad SDQ_* value": "skip", "selftest out of range": "skip"}
    assert res["bad SDQ_* value"]["message"].startswith("engine lacks pager")
    assert res["selftest out of range"]["message"].startswith("engine lacks selftest")
    assert res["stats fields"]["message"].startswith("6 documented fields")


def test_an_unknown_item_is_exit_2(tmp_path, tiny_model, capsys):
    assert epmci_main(["contract-test", "--model", str(tiny_model), "--no-build", "--items", "nosuch"]) == 2
    assert "contract.items: unknown ['nosuch']" in capsys.readouterr().err
