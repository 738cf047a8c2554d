"""The reference tokenizer (epmci/reference/tokenizer.py) and the engine's, written
independently, agree token for token: the whole-model check trusts the reference's ids."""

from __future__ import annotations

import numpy as np
import pytest

from engine.gguf_model import GGUFModel
from engine.tokenizer import Tokenizer
from epmci.gguf.file import ModelFile
from epmci.reference.tokenizer import ReferenceTokenizer

TEXTS = [
    "The capital of France is Paris.", "  leading spaces and trailing   ", "", "a", "x" * 300,
    "Write one sentence about SSD caching, then explain why experts are paged.\n\nNew paragraph\r\n",
    "請用一句話介紹你自己。", "emoji 🙂 and accents: naïve café", "numbers 1234567 3.14159 -42",
    "it's they're we've I'm you'll he'd IT'S", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "tabs\tand\x0bcontrol\x01chars", "mixed<|im_end|>special<|endoftext|>",
]


@pytest.fixture(scope="module", params=["tiny", "ci"])
def pair(request, tiny_model, ci_model):
    path = tiny_model if request.param == "tiny" else ci_model
    return ReferenceTokenizer.of(ModelFile(path)), Tokenizer.from_gguf(GGUFModel(path).file.fields)


def test_agrees_with_the_engine_on_fixed_texts(pair):
    ref, eng = pair
    for t in TEXTS:
        for special in (True, False):
            assert ref.encode(t, parse_special=special) == eng.encode(t, parse_special=special), (t, special)


def test_agrees_with_the_engine_on_random_text(pair):
    ref, eng = pair
    rng = np.random.default_rng(7)
    alphabet = list("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,;:'!?\n\t-()") + ["é", "ß", "中", "文", "🙂"]
    for _ in range(200):
        t = "".join(rng.choice(alphabet, size=int(rng.integers(1, 80))))
        assert ref.encode(t) == eng.encode(t), t


def test_special_tokens_are_one_id_only_when_parsed(pair):
    ref, _ = pair
    ids = ref.encode("<|im_start|>", parse_special=True)
    assert len(ids) == 1 and len(ref.encode("<|im_start|>", parse_special=False)) > 1
