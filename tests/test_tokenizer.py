"""Tokenizer tests: synthetic vocab (epmci.synth.vocab) -> GGUF -> engine.tokenizer."""

from __future__ import annotations

import random

import gguf
import pytest

from engine.gguf_file import GGUFFile
from engine.tokenizer import Tokenizer, bytes_to_unicode as engine_b2u
from epmci.synth.vocab import (
    CORPUS,
    SPECIAL_TOKENS,
    build_vocab,
    bytes_to_unicode,
    write_vocab,
)

N_VOCAB = 1024


def _write_gguf(path, vocab, pre=None):
    w = gguf.GGUFWriter(str(path), arch="qwen3moe")
    if pre is not None:
        vocab = type(vocab)(**{**vocab.__dict__, "pre": pre})
    write_vocab(w, vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def vocab():
    return build_vocab(N_VOCAB)


@pytest.fixture(scope="module")
def tok(vocab, tmp_path_factory):
    path = _write_gguf(tmp_path_factory.mktemp("tok") / "tok.gguf", vocab)
    return Tokenizer.from_gguf(GGUFFile(path).fields)


# ---------------------------------------------------------------- vocab


def test_bytes_to_unicode_matches_gpt2():
    m = bytes_to_unicode()
    assert m == engine_b2u()
    assert len(m) == 256 and len({b for b, _ in m}) == 256 and len({c for _, c in m}) == 256
    d = dict(m)
    assert d[ord("!")] == "!" and d[ord(" ")] == "Ġ" and d[ord("\n")] == "Ċ" and d[0] == "Ā"
    assert m[0] == (ord("!"), "!")


@pytest.mark.parametrize("n", [260, 300, 1024, 3000, 20000])
def test_vocab_shape(n):
    v = build_vocab(n)
    assert len(v.tokens) == n == len(v.token_types)
    assert len(set(v.tokens)) == n
    assert v.tokens[:256] == [c for _, c in bytes_to_unicode()]
    assert v.tokens[-3:] == list(SPECIAL_TOKENS)
    assert v.token_types[:-3] == [1] * (n - 3) and v.token_types[-3:] == [3, 3, 3]
    assert v.bos_id == n - 3 and v.eos_id == n - 1
    assert v.pre == "qwen2" and len(v.merges) >= 1
    toks = set(v.tokens)
    for m in v.merges:
        a, b = m.split(" ")
        assert a in toks and b in toks and a + b in toks
    # every non-byte, non-special token is the result of some merge
    results = {m.replace(" ", "") for m in v.merges}
    assert set(v.tokens[256:-3]) <= results


def test_vocab_deterministic():
    a, b = build_vocab(777), build_vocab(777)
    assert a == b
    assert a is not b and a.tokens is not b.tokens
    # a smaller vocab is a prefix of a larger one (same training order)
    c = build_vocab(600)
    assert c.tokens[:-3] == a.tokens[: 600 - 3] and c.merges == a.merges[: len(c.merges)]


def test_vocab_too_small():
    with pytest.raises(ValueError):
        build_vocab(259)


def test_gguf_metadata_types(vocab, tmp_path):
    path = _write_gguf(tmp_path / "m.gguf", vocab)
    r = gguf.GGUFReader(str(path))
    f = r.fields
    assert bytes(f["general.architecture"].parts[-1]).decode() == "qwen3moe"
    assert bytes(f["tokenizer.ggml.model"].parts[-1]).decode() == "gpt2"
    assert bytes(f["tokenizer.ggml.pre"].parts[-1]).decode() == "qwen2"
    assert [t.name for t in f["tokenizer.ggml.tokens"].types] == ["ARRAY", "STRING"]
    assert [t.name for t in f["tokenizer.ggml.merges"].types] == ["ARRAY", "STRING"]
    assert [t.name for t in f["tokenizer.ggml.token_type"].types] == ["ARRAY", "INT32"]
    assert f["tokenizer.ggml.add_bos_token"].types[0].name == "BOOL"
    assert not bool(f["tokenizer.ggml.add_bos_token"].parts[-1][0])


# ---------------------------------------------------------------- tokenizer


def test_loaded_metadata(tok, vocab):
    assert tok.n_vocab == N_VOCAB
    assert tok.tokens == vocab.tokens
    assert tok.bos_id == vocab.bos_id and tok.eos_id == vocab.eos_id
    assert tok.pre == "qwen2"
    assert tok.eog_ids == {vocab.special_ids["<|endoftext|>"], vocab.special_ids["<|im_end|>"]}


ROUND_TRIP = [
    "",
    "a",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "It's we've they'll I'd you're I'M DON'T",
    "今天天气很好，我们去公园散步吧。",
    "東京は日本の首都です。안녕하세요!",
    "emoji: 😀👍🏽👨‍👩‍👧 ❤️ 🇺🇳",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\r\n\n\n  mixed \t \n",
    "digits 1234567890 3.14159 1e-06 ½ ² ١٢٣",
    "code:\n    def f(x):\n        return x ** 2  # square\n",
    "\x00\x01\x7f control chars \x1c\x1d \u0085 \u00a0 \u2028 \u3000 \ufeff",
    "combining: e\u0301 a\u0308 \u0915\u093f",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|<|im_end|>>|im_end|> <| <|endoftext|",
    "unassigned \U000e0080 \U0010fffd private \ue000",
]


@pytest.mark.parametrize("s", ROUND_TRIP)
def test_round_trip(tok, s):
    ids = tok.encode(s)
    assert all(0 <= i < tok.n_vocab for i in ids)
    assert tok.decode_bytes(ids) == s.encode("utf-8")
    assert tok.decode(ids) == s
    ids2 = tok.encode(s, parse_special=False)
    assert tok.decode_bytes(ids2) == s.encode("utf-8")


def _random_text(rng: random.Random, n: int) -> str:
    pools = [
        (0x20, 0x7E), (0x09, 0x0D), (0x00, 0x1F), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF),
        (0x600, 0x6FF), (0x900, 0x97F), (0x2000, 0x206F), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
        (0xAC00, 0xD7A3), (0xE000, 0xF8FF), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x10000, 0x10FFFF),
    ]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(pools)
        c = rng.randint(lo, hi)
        if 0xD800 <= c <= 0xDFFF:
            c = 0xFFFD
        out.append(chr(c))
    return "".join(out)


@pytest.mark.parametrize("seed", range(8))
def test_round_trip_random(tok, seed):
    rng = random.Random(seed)
    for _ in range(25):
        s = _random_text(rng, rng.randint(1, 80))
        if rng.random() < 0.3:
            s = s + rng.choice(SPECIAL_TOKENS) + _random_text(rng, 10)
        ids = tok.encode(s)
        assert tok.decode_bytes(ids) == s.encode("utf-8"), repr(s)


def test_round_trip_corpus(tok):
    ids = tok.encode(CORPUS)
    assert tok.decode_bytes(ids) == CORPUS.encode("utf-8")
    # BPE compresses the text it was trained on
    assert len(ids) < 0.6 * len(CORPUS.encode("utf-8"))


def test_uses_merges(tok):
    for word in [" the", "The", " expert", " model", "ing"]:
        ids = tok.encode(word)
        assert len(ids) < len(word.encode("utf-8")), (word, ids)
    assert tok.encode(" the") == [tok.token_to_id["Ġthe"]]


def test_byte_tokens(tok, vocab):
    # a lone char with no merges is its byte-level token
    for b, c in bytes_to_unicode():
        assert tok.token_bytes(vocab.tokens.index(c)) == bytes([b])
    assert tok.encode("\x00") == [vocab.tokens.index("Ā")]
    assert tok.encode("!") == [0]


def test_special_tokens(tok, vocab):
    sid = vocab.special_ids
    for t in SPECIAL_TOKENS:
        assert tok.encode(t) == [sid[t]]
        assert tok.token_bytes(sid[t]) == t.encode()
    ids = tok.encode("<|im_start|>user\nhello<|im_end|>")
    assert ids[0] == sid["<|im_start|>"] and ids[-1] == sid["<|im_end|>"]
    assert tok.decode(ids) == "<|im_start|>user\nhello<|im_end|>"
    # adjacent specials
    assert tok.encode("<|im_end|><|im_start|>") == [sid["<|im_end|>"], sid["<|im_start|>"]]
    # not parsed as special when parse_special=False
    ids = tok.encode("<|im_end|>", parse_special=False)
    assert sid["<|im_end|>"] not in ids and len(ids) > 1
    assert tok.decode_bytes(ids) == b"<|im_end|>"
    # decode with special=False drops control tokens
    assert tok.decode([sid["<|im_start|>"]] + tok.encode("hi"), special=False) == "hi"
    assert tok.is_eog(sid["<|im_end|>"]) and tok.is_eog(sid["<|endoftext|>"])
    assert not tok.is_eog(sid["<|im_start|>"])


def test_pretokenizer_qwen2_splits(tok):
    # \p{N} single digits; contractions split; newline runs grouped
    words = tok._pretokenize("I'm 123 ab\n\n  cd")
    assert words == ["I", "'m", "Ġ", "1", "2", "3", "Ġab", "ĊĊ", "Ġ", "Ġcd"]


def test_bpe_lowest_rank_first():
    # tiny hand-made vocab: with merges ["b c", "a b", "a bc"] "abc" must become a + bc -> abc
    base = [c for _, c in bytes_to_unicode()]
    tokens = base + ["bc", "ab", "abc"]
    t = Tokenizer(tokens, ["b c", "a b", "a bc"], pre="qwen2")
    assert t.encode("abc") == [tokens.index("abc")]
    # with "a b" first, "abc" -> ab + c (no "ab c" merge)
    t2 = Tokenizer(tokens, ["a b", "b c", "a bc"], pre="qwen2")
    assert t2.encode("abc") == [tokens.index("ab"), tokens.index("c")]
    # ties on rank go to the leftmost pair: "aaa" with "a a" -> aa + a
    t3 = Tokenizer(base + ["aa"], ["a a"], pre="qwen2")
    assert t3.encode("aaa") == [len(base), base.index("a")]


def test_unknown_pre_raises(vocab, tmp_path):
    path = _write_gguf(tmp_path / "bad.gguf", vocab, pre="no-such-pre")
    with pytest.raises(ValueError, match="pre-tokenizer"):
        Tokenizer.from_gguf(GGUFFile(path).fields)


@pytest.mark.parametrize("pre", ["default", "gpt-2"])
def test_other_pre_round_trip(vocab, tmp_path, pre):
    path = _write_gguf(tmp_path / f"{pre}.gguf", vocab, pre=pre)
    t = Tokenizer.from_gguf(GGUFFile(path).fields)
    for s in ROUND_TRIP:
        assert t.decode_bytes(t.encode(s)) == s.encode("utf-8")


def test_gpt2_pre_splits():
    base = [c for _, c in bytes_to_unicode()]
    t = Tokenizer(base + ["ab"], ["a b"], pre="gpt-2")
    assert t._pretokenize("I'm 123 ab\n\n  cd") == ["I", "'m", "Ġ123", "Ġab", "ĊĊĠ", "Ġcd"]


def test_against_llama_cpp(vocab, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = _write_gguf(tmp_path / "lc.gguf", vocab)
    try:
        lv = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    except Exception as e:  # pragma: no cover - depends on the installed build
        pytest.skip(f"llama_cpp cannot load a vocab-only GGUF: {e}")
    t = Tokenizer.from_gguf(GGUFFile(path).fields)
    rng = random.Random(0)
    samples = ROUND_TRIP + [_random_text(rng, 40) for _ in range(50)] + [CORPUS]
    for s in samples:
        if not s:
            continue
        assert t.encode(s) == lv.tokenize(s.encode(), add_bos=False, special=True), repr(s)
