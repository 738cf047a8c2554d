"""`--tokens-in FILE` (docs/engine-contract.md, Teacher forcing): the token sequence to
evaluate instead of a prompt, read and validated; a file the engine cannot use is a
ModelError naming it (one line, exit 2).

    b"EPMT", uint32 version=1, uint32 n_tokens, uint32 n_prefill, int32 tokens[n_tokens]
"""

from __future__ import annotations

import struct

import numpy as np

from .gguf_model import ModelError

MAGIC = b"EPMT"
VERSION = 1
HEADER = 4 + 3 * 4


def read_tokens(path: str, n_vocab: int) -> tuple[list[int], int]:
    """(tokens, n_prefill) of a --tokens-in file."""
    try:
        with open(path, "rb") as f:
            b = f.read()
    except OSError as e:
        raise ModelError(f"--tokens-in {path}: {e.strerror or e}") from None
    if len(b) < HEADER or b[:4] != MAGIC:
        raise ModelError(f"--tokens-in {path}: not a tokens file (expected magic {MAGIC!r} and a 16-byte header)")
    version, n, n_prefill = struct.unpack_from("<3I", b, 4)
    if version != VERSION:
        raise ModelError(f"--tokens-in {path}: version {version}, this engine reads {VERSION}")
    if len(b) != HEADER + 4 * n:
        raise ModelError(f"--tokens-in {path}: {len(b) - HEADER} bytes of tokens, expected {4 * n} for {n} tokens")
    if not 1 <= n_prefill <= n:
        raise ModelError(f"--tokens-in {path}: n_prefill {n_prefill} must be in 1..n_tokens ({n})")
    tokens = np.frombuffer(b, "<i4", n, HEADER)
    bad = np.nonzero((tokens < 0) | (tokens >= n_vocab))[0]
    if len(bad):
        raise ModelError(f"--tokens-in {path}: token {int(tokens[bad[0]])} at position {int(bad[0])} is not in "
                         f"the vocabulary (0..{n_vocab - 1})")
    return [int(t) for t in tokens], int(n_prefill)
