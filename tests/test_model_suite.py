"""The model suite catches what no per-layer check sees -- attention, RoPE, the KV cache and
the decode path at long context, and an engine evaluating other positions than it was given
-- and points at the position and the layer. Each fault is a broken copy of the engine."""

from __future__ import annotations

import pytest

from faults import ROUTER_NUDGED_IN_LAYER_2, broken_engine, results, run_check, statuses

pytestmark = pytest.mark.usefixtures("built_engine")

SUITE = ("--suites", "model")


def model_results(tmp_path, tiny_model, patch: str) -> tuple[dict[str, str], dict[str, str]]:
    rc, rep = run_check(tmp_path, tiny_model, broken_engine(tmp_path, patch), *SUITE)
    assert rc == 1, rep
    return statuses(rep, "model"), {r["name"]: r["message"] for r in results(rep, "model")}


def test_the_prompt_has_the_positions_the_plan_derived_never_more(tiny_model):
    """The prompt is the model prompt whole, then repeated and cut at a character: at most
    the plan's positions (they bound the reference's work) and no more than a few short of
    them -- unless one whole prompt is longer."""
    from epmci.check.suites.model import long_prompt
    from epmci.config.schema import PromptConfig
    from epmci.gguf.file import ModelFile
    from epmci.reference.tokenizer import ReferenceTokenizer
    tok = ReferenceTokenizer.of(ModelFile(tiny_model))
    text = PromptConfig().model
    whole = len(tok.encode(text, parse_special=False))
    for positions in (5, whole + 1, whole + 37, 3 * whole - 1):
        prompt, ids = long_prompt(text, tok, positions)
        assert tok.encode(prompt, parse_special=False) == ids and prompt.startswith(text)
        assert (len(ids) == whole if positions < whole else positions - 3 <= len(ids) <= positions), (positions, len(ids))


def test_the_bundled_engine_passes_at_every_position(tmp_path, tiny_model):
    rc, rep = run_check(tmp_path, tiny_model, None, *SUITE, "--no-build")
    assert rc == 0, rep
    res = results(rep, "model")
    assert [r["status"] for r in res] == ["pass", "pass"]
    p = res[0]["properties"]
    assert p["prompt_tokens"] >= 128 and p["prompt_identical"] and p["decode_identical"]   # half of tiny's 256
    assert p["decode_steps"] >= 2 and "byte-identical" in res[1]["message"]


@pytest.mark.parametrize("reference_exact", [True, False])
def test_a_router_perturbed_in_one_layer_is_named_by_the_routing_agreement(tmp_path, tiny_model, reference_exact):
    """Layer 2's router logits nudged: routing drifts there first. Whether the logits verdict
    fails (exact) or not (an engine compared within the tolerance), the report names layer 2
    as where the engine's routing first leaves the reference's -- console message and
    properties alike."""
    rc, rep = run_check(tmp_path, tiny_model, broken_engine(tmp_path, ROUTER_NUDGED_IN_LAYER_2, reference_exact=reference_exact), *SUITE,
                        "--set", "model_suite.max_kl=1")
    prompt = results(rep, "model")[0]
    p = prompt["properties"]
    assert p["routing_first_divergent_layer"] == 2 and p["routing_agreement"][:2] == [1.0, 1.0], p
    assert p["routing_agreement"][2] < 1.0
    assert "routing first diverges at layer 2" in prompt["message"], prompt["message"]
    assert (rc == 1) == reference_exact


def test_rope_wrong_beyond_a_position_is_located(tmp_path, tiny_model):
    """RoPE angles off from position 100 on: short prompts never get there."""
    st, msg = model_results(tmp_path, tiny_model, """
        import engine.ops as O
        good = O.rope_cache
        def rope_cache(positions, head_dim, base):
            cos, sin = good(positions, head_dim, base)
            cos[positions >= 100] *= np.float32(1.001)
            return cos, sin
        O.rope_cache = rope_cache
    """)
    assert st == {"prompt positions": "fail", "decode positions": "fail"}
    assert "first at position 100" in msg["prompt positions"]
    assert "layer 0's MoE input already differs" in msg["prompt positions"]


def test_decode_step_at_the_wrong_position_fails_decode_only(tmp_path, tiny_model):
    """Single-token decode steps rotated as if one position earlier: every prompt position is
    right, every decode step wrong."""
    st, msg = model_results(tmp_path, tiny_model, """
        import engine.ops as O
        good = O.rope_cache
        O.rope_cache = lambda positions, d, base: good(positions - 1 if len(positions) == 1 else positions, d, base)
    """)
    assert st == {"prompt positions": "pass", "decode positions": "fail"}
    assert "(decode step 1)" in msg["decode positions"]


def test_kv_cache_row_written_late_in_a_micro_batch_boundary(tmp_path, tiny_model):
    """The attention of a micro-batch ignores the first cached key once the cache is long
    (a window bug): exact until position 64, wrong after."""
    st, msg = model_results(tmp_path, tiny_model, """
        import engine.ops as O
        good = O.attention_probs
        def attention_probs(q16, k_t, pos0, scale):     # k_t: (kv head, dim, position)
            if pos0 >= 64:
                k_t = k_t.copy()
                k_t[:, :, 0] = k_t[:, :, 1]
            return good(q16, k_t, pos0, scale)
        O.attention_probs = attention_probs
    """)
    assert st["prompt positions"] == "fail"
    first = int(msg["prompt positions"].split("first at position ")[1].split(";")[0].split()[0])
    assert 64 <= first < 64 + 32          # the first micro-batch (-b 32) that starts at 64 or later


@pytest.mark.parametrize("fault, what", [
    ("""
        import engine.runtime as R
        good = R.Engine.encode_prompt
        R.Engine.encode_prompt = lambda self, prompt, chat: [self.tokenizer.eos_id] + good(self, prompt, chat)
    """, "an extra leading token"),
    ("""
        import engine.runtime as R
        good = R.Engine.encode_prompt
        R.Engine.encode_prompt = lambda self, prompt, chat: good(self, prompt, True)
    """, "the chat template around a --no-chat prompt"),
])
def test_an_engine_evaluating_other_positions_fails(tmp_path, tiny_model, fault, what):
    st, msg = model_results(tmp_path, tiny_model, fault)
    assert set(st.values()) == {"fail"}, what
    assert "the engine does not evaluate the prompt it was given" in msg["prompt positions"], what


# Tokenizer faults only a prompt with non-ASCII text shows (prompts.model has CJK and a
# combining accent): the engine tokenizes the prompt, the reference tokenizes it independently.
@pytest.mark.parametrize("fault, what", [
    ("""
        import unicodedata
        import engine.tokenizer as T
        good = T.Tokenizer.encode
        T.Tokenizer.encode = lambda self, text, *a, **k: good(self, unicodedata.normalize("NFC", text), *a, **k)
    """, "the prompt NFC-normalized before tokenizing"),
    ("""
        import engine.tokenizer as T
        T._BYTE_TO_CHAR[0xE4], T._BYTE_TO_CHAR[0xE8] = T._BYTE_TO_CHAR[0xE8], T._BYTE_TO_CHAR[0xE4]
    """, "two UTF-8 lead bytes of CJK characters mapped to each other's byte-level character"),
])
def test_an_engine_tokenizing_non_ascii_text_wrongly_fails(tmp_path, tiny_model, fault, what):
    st, msg = model_results(tmp_path, tiny_model, fault)
    assert st["prompt positions"] == "fail", what



def test_the_default_tolerance_fails_an_engine_that_is_not_bit_exact_but_wrong(tmp_path, tiny_model):
    """An engine without reference_exact is compared within model_suite.max_kl (0.01): a copy
    whose logits rows are reversed -- plausible numbers, the wrong distribution -- fails at the
    first position on the defaults, while the same copy unbroken passes (test_teacher_forcing)."""
    cmd = broken_engine(tmp_path, """
        import engine.runtime as R
        good = R.Engine.eval
        R.Engine.eval = lambda self, tokens, phase="prefill", *rest: good(self, tokens, phase, *rest)[:, ::-1].copy()
    """, reference_exact=False)
    rc, rep = run_check(tmp_path, tiny_model, cmd, *SUITE)
    prompt = results(rep, "model")[0]
    assert rc == 1 and prompt["properties"]["mode"] == "kl", prompt
    assert "differ from the reference (kl <= 0.01): first at position 0" in prompt["message"], prompt["message"]
