"""The ggml tensor types the engine computes with: ONE table.

Per type: values and bytes per block (as gguf-py's GGML_QUANT_SIZES) and the type the
activations are quantized to before the dot product (ggml-cpu's `vec_dot_type`: Q8_K for
the k-quants, Q8_0 for Q8_0, none -- F32 -- for F32). The loader accepts exactly these
types, and the kernels and the dispatcher (engine/kernels.py) read their sizes here.
"""

from __future__ import annotations

from dataclasses import dataclass

# gguf.GGMLQuantizationType values
F32 = 0
Q8_0 = 8
Q4_K = 12
Q5_K = 13
Q6_K = 14
Q8_K = 15   # activations only

QK_K = 256    # values per k-quant super-block
QK8_0 = 32    # values per Q8_0 block


@dataclass(frozen=True)
class QType:
    name: str
    block_values: int
    block_bytes: int
    vec_dot_type: int   # what the activations are quantized to (F32: not quantized)


QTYPES: dict[int, QType] = {
    F32: QType("F32", 1, 4, F32),
    Q8_0: QType("Q8_0", QK8_0, 34, Q8_0),
    Q4_K: QType("Q4_K", QK_K, 144, Q8_K),
    Q5_K: QType("Q5_K", QK_K, 176, Q8_K),
    Q6_K: QType("Q6_K", QK_K, 210, Q8_K),
}


def qtype_info(qtype: int) -> QType:
    """The table row of a weight type; ValueError names the type the engine cannot use."""
    t = QTYPES.get(int(qtype))
    if t is None:
        names = ", ".join(f"{v.name}={k}" for k, v in QTYPES.items())
        raise ValueError(f"unsupported ggml type {int(qtype)} (supported: {names})")
    return t
