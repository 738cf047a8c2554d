"""Reference tokenizer: llama.cpp's byte-level BPE (tokenizer.ggml.model `gpt2`), from a
GGUF's `tokenizer.ggml.*` metadata, written independently of the engine's.

The whole-model check needs the prompt's token ids without trusting the engine for them:
an engine that adds a BOS token or wraps a --no-chat prompt in its chat template evaluates
other positions than the reference, and the check must see that.

As llama.cpp (src/llama-vocab.cpp):
1. control and user-defined tokens are cut out of the text literally, longest first
   (control tokens only when parsing special tokens, as a prompt does);
2. each remaining fragment is split by the pre-tokenizer regex of `tokenizer.ggml.pre`;
3. each piece is written in the GPT-2 byte alphabet and merged by BPE: repeatedly the
   adjacent pair with the lowest merge rank, the leftmost of equal ranks;
4. a symbol that is no token falls back to its single-byte tokens.
"""

from __future__ import annotations

from functools import lru_cache

import regex

from ..errors import InputError
from ..gguf.file import ModelFile

CONTROL, USER_DEFINED = 3, 4
# Token texts that end generation besides tokenizer.ggml.eos_token_id (llama.cpp's llama-vocab.cpp
# heuristic; docs/engine-contract.md, End of generation).
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})

# llama.cpp's regexes for the pre-tokenizer types epmci's models use.
PRETOKENIZERS = {
    "qwen2": (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "qwen35": (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
               r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}


def bytes_to_unicode() -> list[tuple[int, str]]:
    """GPT-2's byte-level alphabet as (byte, char) pairs, in its order (llama.cpp's
    unicode_byte_to_utf8_map): '!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves, every other
    byte, in increasing order, for chr(256 + n), n = 0, 1, ..."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = [b for b in range(256) if b not in set(keep)]
    return [(b, chr(b)) for b in keep] + [(b, chr(256 + n)) for n, b in enumerate(extra)]


BYTE_CHAR = dict(bytes_to_unicode())
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


class ReferenceTokenizer:
    def __init__(self, tokens: list[str], merges: list[str], token_types: list[int] | None, pre: str,
                 eos: int | None = None):
        if pre not in PRETOKENIZERS:
            raise ValueError(f"pre-tokenizer {pre!r} is not one the reference knows ({', '.join(PRETOKENIZERS)})")
        self.pattern = regex.compile(PRETOKENIZERS[pre])
        self.tokens = tokens
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.eog = frozenset({i for i, t in enumerate(tokens) if t in EOG_TEXTS} | ({eos} if eos is not None else set()))
        self.rank = {}
        for r, m in enumerate(merges):
            left, _, right = m.partition(" ")
            self.rank.setdefault((left, right), r)
        types = token_types or [1] * len(tokens)
        self.types = types
        self.special = sorted(((t, i, types[i]) for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)),
                              key=lambda s: (-len(s[0].encode("utf-8")), s[1]))

    @classmethod
    def of(cls, mf: ModelFile) -> "ReferenceTokenizer":
        try:
            eos = mf.meta("tokenizer.ggml.eos_token_id", None)
            return cls(list(mf.meta("tokenizer.ggml.tokens")), list(mf.meta("tokenizer.ggml.merges")),
                       mf.meta("tokenizer.ggml.token_type", None), str(mf.meta("tokenizer.ggml.pre", "")),
                       None if eos is None else int(eos))
        except ValueError as e:
            raise InputError(mf.path, f"tokenizer: {e}") from None

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        out: list[int] = []
        for frag in self._split_special(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                continue
            for piece in self.pattern.findall(frag):
                out += self._bpe("".join(BYTE_CHAR[b] for b in piece.encode("utf-8")))
        return out

    def token_bytes(self, token: int) -> bytes:
        """What a token prints as: control and user-defined tokens their text, every other
        one its text read back through GPT-2's byte alphabet."""
        text = self.tokens[token]
        if self.types[token] in (CONTROL, USER_DEFINED):
            return text.encode("utf-8")
        return b"".join(bytes([CHAR_BYTE[c]]) if c in CHAR_BYTE else c.encode("utf-8") for c in text)

    def text(self, tokens) -> str:
        """Generated tokens as an engine prints them: their bytes as UTF-8, invalid bytes U+FFFD."""
        return b"".join(self.token_bytes(int(t)) for t in tokens).decode("utf-8", "replace")

    def _split_special(self, text: str, parse_special: bool) -> list:
        frags: list = [text]
        for tok, i, kind in self.special:
            if kind == CONTROL and not parse_special:
                continue
            nxt: list = []
            for f in frags:
                if isinstance(f, int):
                    nxt.append(f)
                    continue
                parts = f.split(tok)
                for k, p in enumerate(parts):
                    if k:
                        nxt.append(i)
                    if p:
                        nxt.append(p)
            frags = nxt
        return frags

    @lru_cache(maxsize=1 << 16)
    def _bpe(self, word: str) -> tuple[int, ...]:
        syms = list(word)
        while len(syms) > 1:
            ranks = [self.rank.get((a, b)) for a, b in zip(syms, syms[1:])]
            best = min((r for r in ranks if r is not None), default=None)
            if best is None:
                break
            j = ranks.index(best)                 # leftmost pair of the lowest rank
            syms[j:j + 2] = [syms[j] + syms[j + 1]]
        out: list[int] = []
        for s in syms:
            if s in self.ids:
                out.append(self.ids[s])
            else:                                  # byte fallback: single-byte tokens that exist
                out += [self.ids[c] for c in s.encode("utf-8").decode("latin-1") if c in self.ids and ord(c) < 0x80]
        return tuple(out)
