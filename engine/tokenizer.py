"""gpt2-style byte-level BPE tokenizer built from GGUF ``tokenizer.ggml.*`` metadata.

Follows llama.cpp (src/llama-vocab.cpp, src/unicode.cpp):

* special-token partition (``tokenizer_st_partition``): control / user-defined /
  unknown tokens are matched literally in the raw text, longest first, before
  pre-tokenization; with ``parse_special=False`` only user-defined tokens are;
* pre-tokenization with the regex(es) llama.cpp uses for ``tokenizer.ggml.pre``;
* GPT-2 byte-level encoding of every pre-token word (``bytes_to_unicode``);
* rank-based BPE per word (``llm_tokenizer_bpe_session``): repeatedly merge the
  adjacent pair with the lowest merge rank, ties going to the leftmost pair;
* detokenization (``token_to_piece``): normal tokens map back through the
  inverse byte map, control / user-defined tokens render as their text.

This module is part of the engine under test and must not import ``epmci``.
"""

from __future__ import annotations

import heapq
import warnings
from typing import Iterable, Mapping, Sequence

import regex

from .gguf_file import ARRAY, INT32, STRING, Field

__all__ = ["Tokenizer", "TokenType", "bytes_to_unicode"]


class TokenType:
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


def bytes_to_unicode() -> list[tuple[int, str]]:
    """GPT-2 byte-level map as (byte, char) pairs, in bytes_to_unicode order (llama.cpp unicode.cpp)."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [(b, chr(c)) for b, c in zip(bs, cs)]


_BYTE_TO_CHAR: list[str] = [""] * 256
_CHAR_TO_BYTE: dict[str, int] = {}
for _b, _c in bytes_to_unicode():
    _BYTE_TO_CHAR[_b] = _c
    _CHAR_TO_BYTE[_c] = _b


# ---------------------------------------------------------------------------
# pre-tokenizer regexes (llama.cpp src/llama-vocab.cpp, llm_tokenizer_bpe)
# ---------------------------------------------------------------------------

_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp runs its regex string "'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# through a hand-written splitter (unicode_regex_split_custom_gpt2) which also
# accepts a trailing "\s+", does not group unassigned code points (no category
# flags) into the punctuation run, and emits any unmatched code point alone.
_GPT2 = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}\p{Cn}]+|\s+(?!\S)|\s+|(?s:.)"
)
_DEFAULT = [
    r"[\p{P}\$\+<=>\^~\|]+",
    _GPT2,
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
]

# tokenizer.ggml.pre -> regexes applied in sequence; names map to pre-types as in llama_vocab::impl::load
_PRE_TYPES: dict[str, list[str]] = {}
for _name in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"):
    _PRE_TYPES[_name] = [_QWEN2]
_PRE_TYPES["qwen35"] = [_QWEN35]
for _name in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
              "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4"):
    _PRE_TYPES[_name] = [_GPT2]
_PRE_TYPES["default"] = _DEFAULT

_COMPILED: dict[str, regex.Pattern] = {}


def _compile(p: str) -> regex.Pattern:
    c = _COMPILED.get(p)
    if c is None:
        c = _COMPILED[p] = regex.compile(p)
    return c


# token texts llama.cpp treats as end-of-generation (and forces to CONTROL)
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})
# FIM / EOT-looking tokens llama.cpp also forces to CONTROL
_CONTROL_TEXTS = _EOG_TEXTS | frozenset({
    "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|fim_repo|>",
    "<|repo_name|>", "<|file_sep|>",
})

_WORD_CACHE_MAX = 1 << 17


# ---------------------------------------------------------------------------
# GGUF metadata access
# ---------------------------------------------------------------------------


class Tokenizer:
    """Byte-level BPE tokenizer (tokenizer.ggml.model = "gpt2")."""

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        token_types: Sequence[int] | None = None,
        pre: str | None = "qwen2",
        bos_id: int | None = None,
        eos_id: int | None = None,
        add_bos: bool = False,
        pad_id: int | None = None,
    ) -> None:
        n = len(tokens)
        if n == 0:
            raise ValueError("tokenizer vocabulary is empty")
        if not merges:
            raise ValueError("tokenizer merges are missing (a gpt2 BPE vocabulary needs at least one merge)")

        # pre-tokenizer
        if pre is None or pre == "":
            warnings.warn("missing tokenizer.ggml.pre, using 'default' (as llama.cpp does)", stacklevel=2)
            pre = "default"
        if pre not in _PRE_TYPES:
            raise ValueError(
                f"unknown pre-tokenizer type: {pre!r} (supported: {', '.join(sorted(_PRE_TYPES))})"
            )
        self.pre = pre
        self._regexes = [_compile(p) for p in _PRE_TYPES[pre]]

        # vocabulary
        self.tokens: list[str] = []
        self.token_to_id: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t == "":
                t = f"[EMPTY_{i}]"
            if t in self.token_to_id:
                raise ValueError(f"duplicate token in vocabulary: {t!r} has ids {self.token_to_id[t]} and {i}")
            self.token_to_id[t] = i
            self.tokens.append(t)

        if token_types is None:
            types = [TokenType.NORMAL] * n
        else:
            if len(token_types) < n:
                raise ValueError(f"token_type array too short ({len(token_types)} < {n})")
            types = [int(t) for t in token_types[:n]]
        for i, t in enumerate(self.tokens):
            if t in _CONTROL_TEXTS:
                types[i] = TokenType.CONTROL
        self.token_types = types

        # merges: "left right", split at the first space after position 0
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, m in enumerate(merges):
            pos = m.find(" ", 1)
            first, second = (m[:pos], m[pos + 1:]) if pos >= 0 else ("", "")
            self._ranks.setdefault((first, second), rank)

        # special ids (llama.cpp's gpt2 default is 11 for both when not given and in range)
        self.bos_id = bos_id if bos_id is not None and 0 <= bos_id < n else (11 if n > 11 else None)
        self.eos_id = eos_id if eos_id is not None and 0 <= eos_id < n else (11 if n > 11 else None)
        self.pad_id = pad_id if pad_id is not None and 0 <= pad_id < n else None
        self.add_bos = bool(add_bos)
        if self.add_bos and self.bos_id is None:
            raise ValueError("add_bos_token is true, but bos_token_id is not set")

        eog = {i for i, t in enumerate(self.tokens) if t in _EOG_TEXTS}
        if self.eos_id is not None:
            eog.add(self.eos_id)
        self.eog_ids: frozenset[int] = frozenset(eog)

        # special-token partition order: longest text (in bytes) first; ties by id
        special_attrs = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
        self._special: list[tuple[str, int, bool]] = [
            (self.tokens[i], i, types[i] == TokenType.USER_DEFINED)
            for i in sorted(
                (i for i in range(n) if types[i] in special_attrs),
                key=lambda i: (-len(self.tokens[i].encode("utf-8")), i),
            )
        ]

        self._pieces: list[bytes] = [self._piece(i) for i in range(n)]
        self._cache: dict[str, tuple[int, ...]] = {}

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_gguf(cls, fields: Mapping[str, Field]) -> "Tokenizer":
        """Build from a GGUF file's metadata (engine.gguf_file: the tokenizer.ggml.* keys)."""
        def get(key: str, want: str, kind: int, array: bool = False):
            f = fields.get(key)
            if f is not None and ((f.type, f.item_type) != ((ARRAY, kind) if array else (kind, None))):
                raise ValueError(f"invalid gguf type for {key}{want}")
            return None if f is None else f.contents()

        model = get("tokenizer.ggml.model", "", STRING)
        if model is None:
            raise ValueError("GGUF has no tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"unsupported tokenizer model {model!r} (only 'gpt2' byte-level BPE is supported)")
        tokens = get("tokenizer.ggml.tokens", "", STRING, array=True)
        if tokens is None:
            raise ValueError("cannot find tokenizer vocab (tokenizer.ggml.tokens) in model file")
        merges = get("tokenizer.ggml.merges", "", STRING, array=True)
        if merges is None:
            raise ValueError("cannot find tokenizer merges (tokenizer.ggml.merges) in model file")
        token_types = get("tokenizer.ggml.token_type", " (must be an INT32 array)", INT32, array=True)

        def opt_int(key: str) -> int | None:
            f = fields.get(key)
            if f is not None and (f.item_type is not None or not isinstance(f.value, int)):
                raise ValueError(f"invalid gguf type for {key} (must be an integer)")
            return None if f is None else int(f.value)

        add_bos = fields.get("tokenizer.ggml.add_bos_token")
        return cls(
            tokens=tokens,
            merges=merges,
            token_types=token_types,
            pre=get("tokenizer.ggml.pre", "", STRING),
            bos_id=opt_int("tokenizer.ggml.bos_token_id"),
            eos_id=opt_int("tokenizer.ggml.eos_token_id"),
            add_bos=bool(add_bos.value) if add_bos is not None and add_bos.item_type is None else False,
            pad_id=opt_int("tokenizer.ggml.padding_token_id"),
        )

    # --------------------------------------------------------------- properties

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    # ----------------------------------------------------------------- encoding

    def encode(self, text: str, parse_special: bool = True, add_special: bool = False) -> list[int]:
        """Tokenize ``text``.

        ``parse_special``: match control tokens (e.g. ``<|im_start|>``) in the text
        (user-defined tokens are always matched, as in llama.cpp).  ``add_special``:
        prepend BOS if the model asks for it (tokenizer.ggml.add_bos_token).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() expects str, got {type(text).__name__}")
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        if not text:
            return out
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
            else:
                for word in self._pretokenize(frag):
                    ids = self._cache.get(word)
                    if ids is None:
                        ids = self._bpe(word)
                        if len(self._cache) >= _WORD_CACHE_MAX:
                            self._cache.clear()
                        self._cache[word] = ids
                    out.extend(ids)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        frags: list[str | int] = [text]
        for tok_text, tok_id, user_defined in self._special:
            if not parse_special and not user_defined:
                continue
            new: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or tok_text not in frag:
                    new.append(frag)
                    continue
                parts = frag.split(tok_text)
                for k, part in enumerate(parts):
                    if k:
                        new.append(tok_id)
                    if part:
                        new.append(part)
            frags = new
        return frags

    def _pretokenize(self, text: str) -> list[str]:
        """Split with the pre-tokenizer regex(es) and byte-encode each word."""
        words = [text]
        for rx in self._regexes:
            out: list[str] = []
            for w in words:
                pos = 0
                for m in rx.finditer(w):
                    s, e = m.span()
                    if s > pos:
                        out.append(w[pos:s])
                    if e > s:
                        out.append(w[s:e])
                    pos = e
                if pos < len(w):
                    out.append(w[pos:])
            words = out
        b2c = _BYTE_TO_CHAR
        return ["".join([b2c[b] for b in w.encode("utf-8")]) for w in words]

    def _bpe(self, word: str) -> tuple[int, ...]:
        t2i = self.token_to_id
        tid = t2i.get(word)
        if len(word) == 1:
            return (tid,) if tid is not None else self._fallback(word)
        ranks = self._ranks
        texts = list(word)
        n = len(texts)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[int, int, int, str]] = []

        def add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            r = ranks.get((texts[left], texts[right]))
            if r is not None:
                heapq.heappush(heap, (r, left, right, texts[left] + texts[right]))

        for i in range(n - 1):
            add(i, i + 1)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            lt, rt = texts[left], texts[right]
            if not lt or not rt or lt + rt != merged:
                continue  # outdated bigram
            texts[left] = merged
            texts[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])

        out: list[int] = []
        i = 0
        while i != -1:
            sym = texts[i]
            tid = t2i.get(sym)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._fallback(sym))
            i = nxt[i]
        return tuple(out)

    def _fallback(self, sym: str) -> tuple[int, ...]:
        # llama.cpp: a symbol that is not a token is emitted byte by byte, looking up each
        # single UTF-8 byte of its (byte-encoded) text; bytes without a token are dropped.
        out = []
        for b in sym.encode("utf-8"):
            if b < 0x80:
                tid = self.token_to_id.get(chr(b))
                if tid is not None:
                    out.append(tid)
        return tuple(out)

    # ----------------------------------------------------------------- decoding

    def _piece(self, token_id: int) -> bytes:
        text = self.tokens[token_id]
        tt = self.token_types[token_id]
        if tt in (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN):
            return text.encode("utf-8")
        if tt == TokenType.NORMAL:
            out = bytearray()
            for ch in text:
                b = _CHAR_TO_BYTE.get(ch)
                if b is not None:
                    out.append(b)
                else:  # as llama_decode_text
                    u = ch.encode("utf-8")
                    out += b"[UNK_BYTE_0x" + u.hex().encode() + text.encode("utf-8") + b"]"
            return bytes(out)
        if tt == TokenType.BYTE:  # "<0xXX>" tokens
            return bytes([int(text[3:5], 16)])
        return b""  # unused / undefined: rendered as nothing

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token renders to (control tokens render as their text)."""
        if not 0 <= token_id < len(self.tokens):
            raise IndexError(f"token id {token_id} out of range [0, {len(self.tokens)})")
        return self._pieces[token_id]

    def decode_bytes(self, ids: Iterable[int], special: bool = True) -> bytes:
        """Exact bytes of ``ids``; with ``special=False`` control/unknown tokens render as nothing."""
        pieces = self._pieces
        n = len(pieces)
        out = []
        for t in ids:
            t = int(t)
            if not 0 <= t < n:
                raise IndexError(f"token id {t} out of range [0, {n})")
            if not special and self.token_types[t] in (TokenType.CONTROL, TokenType.UNKNOWN):
                continue
            out.append(pieces[t])
        return b"".join(out)

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        return self.decode_bytes(ids, special=special).decode("utf-8", errors="replace")
