"""What epmci hands an engine as a file (docs/engine-contract.md): the token sequence of a
teacher-forced run, `--tokens-in FILE`.

    b"EPMT", uint32 version=1, uint32 n_tokens, uint32 n_prefill, int32 tokens[n_tokens]
"""

from __future__ import annotations

import os
import struct

import numpy as np

from ..fsutil import atomic_write

TOKENS_MAGIC = b"EPMT"
TOKENS_VERSION = 1


def tokens_file(tokens, n_prefill: int) -> bytes:
    t = np.ascontiguousarray(tokens, dtype="<i4")
    if not 1 <= n_prefill <= len(t):
        raise ValueError(f"n_prefill {n_prefill} must be in 1..{len(t)}")
    return TOKENS_MAGIC + struct.pack("<3I", TOKENS_VERSION, len(t), n_prefill) + t.tobytes()


def write_tokens(path: str | os.PathLike, tokens, n_prefill: int) -> None:
    """The first n_prefill tokens are the prefill, each later one a decode step."""
    atomic_write(path, tokens_file(tokens, n_prefill))
