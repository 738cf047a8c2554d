"""Tokenizer vocabulary for synthetic qwen3moe GGUF models.

The synthetic models have random weights but a real, working gpt2-style
byte-level BPE tokenizer, laid out the way real Qwen2/Qwen3 GGUFs are:

* ids 0..255: the 256 GPT-2 byte-level characters, in ``bytes_to_unicode``
  order (printable bytes first, the remapped ones after), all token type 1
  (normal) -- in gpt2-style GGUFs these are ordinary tokens, not type 6
  "byte" tokens (llama.cpp would parse a type-6 token as ``<0xXX>``);
* then one token per BPE merge, in merge-rank order, learned
  deterministically on the small embedded corpus ``CORPUS`` (and padded
  with synthetic merges when the corpus runs out of pairs);
* last, the control tokens ``<|endoftext|>``, ``<|im_start|>``,
  ``<|im_end|>`` (token type 3).

``tokenizer.ggml.pre`` is ``"qwen2"``; the pre-tokenizer regex used for
training is the one llama.cpp uses for that name (src/llama-vocab.cpp).

This module is part of the test harness and deliberately does not import
anything from ``engine/`` (the system under test).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

import regex

from ..reference.tokenizer import PRETOKENIZERS, bytes_to_unicode

__all__ = [
    "Vocab",
    "build_vocab",
    "write_vocab",
    "bytes_to_unicode",
    "QWEN2_PRETOKENIZER_REGEX",
    "SPECIAL_TOKENS",
    "CORPUS",
    "TOKEN_TYPE_NORMAL",
    "TOKEN_TYPE_CONTROL",
]

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# llama.cpp src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_QWEN2 (the tokenizer.json regex with
# the case-insensitive contraction group spelled out): the reference tokenizer's.
QWEN2_PRETOKENIZER_REGEX = PRETOKENIZERS["qwen2"]
_PRETOKENIZER = regex.compile(QWEN2_PRETOKENIZER_REGEX)


_BYTE_TO_CHAR: list[str] = [""] * 256
for _b, _c in bytes_to_unicode():
    _BYTE_TO_CHAR[_b] = _c


def _byte_encode(s: str) -> str:
    return "".join([_BYTE_TO_CHAR[b] for b in s.encode("utf-8")])


@dataclass
class Vocab:
    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    bos_id: int
    eos_id: int
    pad_id: int
    pre: str = "qwen2"
    model: str = "gpt2"
    add_bos: bool = False
    special_ids: dict[str, int] = field(default_factory=dict)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


# ---------------------------------------------------------------------------
# training corpus (original text written for this project)
# ---------------------------------------------------------------------------

CORPUS = r'''
The quick brown fox jumps over the lazy dog. The dog did not mind; it was a
warm afternoon and the garden smelled of cut grass and rain. Somewhere down
the street a radio was playing an old song about the sea, and the children
were counting the boats that came in before the evening tide.

It's a truth we've learned the hard way: a test that can't fail isn't a test.
When the numbers don't match, we'll look at the inputs first, then the code,
and only then at the hardware. They're usually right about that, and I'd
rather be careful than fast. You'll see why in a moment.

A mixture-of-experts model routes every token to a small number of experts.
The router computes a score for each expert, keeps the top eight, normalizes
their weights, and sums the expert outputs. Paging experts in and out of
memory is cheap when the access pattern is predictable, and expensive when
it is not. The engine keeps a cache of recently used experts and evicts the
least recently used one when the cache is full.

Results for the evaluation run on 2024-03-17: 1024 prompts, 4096 tokens each,
median latency 37.5 ms, p99 latency 112.8 ms, throughput 1893 tokens/s.
Version 3.14.159 was released on 12/31/1999 at 23:59:59 UTC (price: $42.00,
discount 15%, total = 35.70 EUR). Call +1-555-0100 or write to ops@example.org.

def softmax(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]


class ExpertCache:
    """Least-recently-used cache of expert weights."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries = OrderedDict()

    def get(self, layer: int, expert: int):
        key = (layer, expert)
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        return None

    def put(self, layer, expert, weights):
        self.entries[(layer, expert)] = weights
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)


for i in range(10):
    if i % 2 == 0:
        print(f"even: {i}")
    else:
        print(f"odd: {i}")

static inline float silu(float x) {
    return x / (1.0f + expf(-x));
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "model.gguf";
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        fprintf(stderr, "error: cannot open %s\n", path);
        return 1;
    }
    for (size_t i = 0; i < n; ++i) {
        y[i] = silu(x[i]) * z[i];
    }
    fclose(fp);
    return 0;
}

{"model": "qwen3moe", "n_layer": 4, "n_expert": 8, "n_expert_used": 2,
 "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "vocab": ["<|im_start|>", "user"]}

<html><body><p class="note">Hello, world!</p><a href="https://example.com/a?b=1&c=2">link</a></body></html>

SELECT name, COUNT(*) AS n FROM runs WHERE status = 'failed' GROUP BY name ORDER BY n DESC;

$ python -m pytest -q -n 4 tests/ && echo "all green" || echo "something broke"

今天天气很好，我们去公园散步吧。机器学习模型需要大量的数据和计算资源。
专家混合模型把每个词元分配给少数几个专家，从而在保持质量的同时降低计算量。
中文、日本語、한국어 are written with different scripts, 但是它们都可以用 UTF-8 编码。

東京は日本の首都です。今日はとても暑いですね。ひらがなとカタカナと漢字を使います。
モデルの重みはランダムですが、トークナイザーは本物です。

안녕하세요, 만나서 반갑습니다. 오늘 날씨가 정말 좋네요. 한국어는 한글로 씁니다.

Привет, мир! Это пример текста на русском языке. Москва — столица России.
Γεια σου κόσμε! Η γρήγορη καφέ αλεπού πηδάει πάνω από το τεμπέλικο σκυλί.
Größe, Übung, Straße, naïve café, façade, résumé, smörgåsbord, jalapeño, Ærøskøbing.
مرحبا بالعالم. هذه جملة قصيرة باللغة العربية.
नमस्ते दुनिया। यह हिंदी में एक छोटा वाक्य है।
שלום עולם. ไทย สวัสดีครับ. Tiếng Việt có dấu: người, được, những.

Emoji and symbols: 😀 😂 🎉 🚀 🔥 ❤️ 👍🏽 👨‍👩‍👧 ✅ ❌ ⚠️ → ← ↑ ↓ ∑ ∫ √ ∞ ≤ ≥ ≠ ± × ÷ °C € £ ¥ © ® ™ … “quoted” ‘single’ — dash – en.
Math: E = mc², a² + b² = c², ½ + ¼ = ¾, x₁ + x₂ = 0, α β γ δ ε λ μ π σ ω.

	Tabs	and  double  spaces,   triple   spaces,
trailing spaces   
and blank lines:


The end. The end? The end! "The end," she said. (The end.) [the end] {the end}
'''


# ---------------------------------------------------------------------------
# BPE training
# ---------------------------------------------------------------------------


def _train_merges(corpus: str, max_new_tokens: int, reserved: set[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Learn up to ``max_new_tokens`` merges from ``corpus``.

    Classic BPE: repeatedly merge the most frequent adjacent symbol pair
    within pre-tokenized words.  Ties are broken by the pair's strings
    (lexicographically smallest first), so the result is fully
    deterministic.  Returns (merges, new tokens in creation order).  A merge
    whose result already exists as a token (reached through a different
    split) is kept as a merge but adds no token.
    """
    word_counts = Counter(_byte_encode(w) for w in _PRETOKENIZER.findall(corpus))
    words: list[list[str]] = []
    freqs: list[int] = []
    for w in sorted(word_counts):
        if len(w) > 1:
            words.append(list(w))
            freqs.append(word_counts[w])

    pair_count: dict[tuple[str, str], int] = {}
    pair_words: dict[tuple[str, str], set[int]] = {}
    for wi, syms in enumerate(words):
        f = freqs[wi]
        for a, b in zip(syms, syms[1:]):
            pair_count[(a, b)] = pair_count.get((a, b), 0) + f
            pair_words.setdefault((a, b), set()).add(wi)

    heap = [(-c, a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)

    known: set[str] = {c for _, c in bytes_to_unicode()}
    merges: list[tuple[str, str]] = []
    new_tokens: list[str] = []

    def bump(pair: tuple[str, str], delta: int, wi: int) -> None:
        c = pair_count.get(pair, 0) + delta
        pair_count[pair] = c
        if delta > 0:
            pair_words.setdefault(pair, set()).add(wi)
        if c > 0:
            heapq.heappush(heap, (-c, pair[0], pair[1]))

    while heap and len(new_tokens) < max_new_tokens:
        negc, a, b = heapq.heappop(heap)
        if pair_count.get((a, b), 0) != -negc or negc == 0:
            continue  # stale heap entry
        merged = a + b
        if merged in reserved:
            pair_count[(a, b)] = 0  # never merge into a special token's text
            continue
        merges.append((a, b))
        if merged not in known:
            known.add(merged)
            new_tokens.append(merged)
        for wi in sorted(pair_words.get((a, b), ())):
            syms = words[wi]
            f = freqs[wi]
            i = 0
            out: list[str] = []
            changed = False
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(merged)
                    i += 2
                    changed = True
                else:
                    out.append(syms[i])
                    i += 1
            if not changed:
                continue
            for p in zip(syms, syms[1:]):
                bump(p, -f, wi)
            for p in zip(out, out[1:]):
                bump(p, +f, wi)
            words[wi] = out
        pair_count[(a, b)] = 0
        pair_words.pop((a, b), None)

    return merges, new_tokens


def _pad_merges(tokens: list[str], known: set[str], reserved: set[str], n_needed: int) -> list[tuple[str, str]]:
    """Deterministic filler merges ``tokens[i] + byte_char`` in breadth-first order.

    Walks the token list (which grows as filler tokens are added) and pairs
    each token with every byte-level char in bytes_to_unicode order, keeping
    each concatenation that is not yet a token.  Starting from the 256 byte
    chars this enumerates all 2-char strings first, then longer ones.
    """
    chars = [c for _, c in bytes_to_unicode()]
    merges: list[tuple[str, str]] = []
    i = 0
    while len(merges) < n_needed:
        left = tokens[i]
        for c in chars:
            cand = left + c
            if cand in known or cand in reserved:
                continue
            known.add(cand)
            tokens.append(cand)
            merges.append((left, c))
            if len(merges) == n_needed:
                break
        i += 1
    return merges


@lru_cache(maxsize=8)
def _build(n_vocab: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    n_special = len(SPECIAL_TOKENS)
    n_new = n_vocab - 256 - n_special
    reserved = set(SPECIAL_TOKENS)

    base = [c for _, c in bytes_to_unicode()]
    merges, new_tokens = _train_merges(CORPUS, n_new, reserved)
    tokens = base + new_tokens
    if len(new_tokens) < n_new:
        known = set(tokens)
        merges += _pad_merges(tokens, known, reserved, n_new - len(new_tokens))
    assert len(tokens) == 256 + n_new
    tokens += list(SPECIAL_TOKENS)
    return tuple(tokens), tuple(f"{a} {b}" for a, b in merges)


def build_vocab(n_vocab: int) -> Vocab:
    """Build the deterministic qwen2-style byte-level BPE vocabulary of exactly ``n_vocab`` tokens."""
    n_min = 256 + len(SPECIAL_TOKENS) + 1
    if not isinstance(n_vocab, int) or n_vocab < n_min:
        raise ValueError(f"n_vocab must be an int >= {n_min} (256 byte tokens + >=1 merge + "
                         f"{len(SPECIAL_TOKENS)} special tokens), got {n_vocab!r}")
    tokens, merges = _build(n_vocab)
    n_special = len(SPECIAL_TOKENS)
    token_types = [TOKEN_TYPE_NORMAL] * (n_vocab - n_special) + [TOKEN_TYPE_CONTROL] * n_special
    special_ids = {t: n_vocab - n_special + i for i, t in enumerate(SPECIAL_TOKENS)}
    return Vocab(
        tokens=list(tokens),
        merges=list(merges),
        token_types=token_types,
        # as in Qwen2/Qwen3 GGUFs: bos = pad = <|endoftext|>, eos = <|im_end|>, add_bos = false
        bos_id=special_ids["<|endoftext|>"],
        eos_id=special_ids["<|im_end|>"],
        pad_id=special_ids["<|endoftext|>"],
        pre="qwen2",
        model="gpt2",
        add_bos=False,
        special_ids=special_ids,
    )


def write_vocab(writer, vocab: Vocab) -> None:
    """Add the ``tokenizer.ggml.*`` metadata for ``vocab`` to a ``gguf.GGUFWriter``."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_pad_token_id(vocab.pad_id)
    writer.add_add_bos_token(vocab.add_bos)
