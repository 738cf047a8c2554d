"""Random but valid quantized blocks with a controlled value scale.

gguf-py cannot quantize K-quants, and quantizing gigabytes of float weights would be slow;
the weights are random anyway, so each block is drawn directly: random quants, random
6-bit (or int8) sub-block scales, and a super-block scale `d` chosen so that the
dequantized values have roughly the standard deviation asked for and mean ~0.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

QK_K = 256


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def _pack_scale_min_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Inverse of ggml's get_scale_min_k4: 8 six-bit (scale, min) pairs -> 12 bytes."""
    q = np.zeros((*sc.shape[:-1], 12), dtype=np.uint8)
    q[..., 0:4] = sc[..., 0:4] | ((sc[..., 4:8] >> 4) << 6)
    q[..., 4:8] = m[..., 0:4] | ((m[..., 4:8] >> 4) << 6)
    q[..., 8:12] = (sc[..., 4:8] & 0xF) | ((m[..., 4:8] & 0xF) << 4)
    return q


def _super_scale(rng: np.random.Generator, nb: int, value_std: float, unit_std: float) -> np.ndarray:
    """Per-block d so that d * (typical sub-scale * quant) has std value_std, +-50% jitter."""
    return (value_std / unit_std) * rng.uniform(0.5, 1.5, size=nb)


def _k4_like(rng, nb, std, n_bits, with_qh):
    levels = 1 << n_bits
    sc = rng.integers(32, 64, size=(nb, 8), dtype=np.uint8)
    q_std = np.sqrt((levels**2 - 1) / 12.0)
    d = _super_scale(rng, nb, std, q_std * np.sqrt(np.mean(np.arange(32, 64) ** 2)))
    # min == scale and dmin = d * mid-level: values are d*sc*(q - mid), centred on 0.
    dmin = d * (levels - 1) / 2.0
    parts = [_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min_k4(sc, sc)]
    if with_qh:
        parts.append(rng.integers(0, 256, size=(nb, 32), dtype=np.uint8))
    parts.append(rng.integers(0, 256, size=(nb, 128), dtype=np.uint8))
    return np.concatenate(parts, axis=1)


def q4_k(rng: np.random.Generator, nb: int, std: float) -> np.ndarray:
    return _k4_like(rng, nb, std, 4, with_qh=False)


def q5_k(rng: np.random.Generator, nb: int, std: float) -> np.ndarray:
    return _k4_like(rng, nb, std, 5, with_qh=True)


def q6_k(rng: np.random.Generator, nb: int, std: float) -> np.ndarray:
    mag = rng.integers(16, 128, size=(nb, 16))
    sign = rng.choice(np.array([-1, 1]), size=(nb, 16))
    scales = (mag * sign).astype(np.int8).view(np.uint8)
    q_std = np.sqrt((64**2 - 1) / 12.0)
    d = _super_scale(rng, nb, std, q_std * np.sqrt(np.mean(np.arange(16, 128) ** 2)))
    ql = rng.integers(0, 256, size=(nb, 128), dtype=np.uint8)
    qh = rng.integers(0, 256, size=(nb, 64), dtype=np.uint8)
    return np.concatenate([ql, qh, scales, _f16_bytes(d)], axis=1)


def q8_0(rng: np.random.Generator, nb: int, std: float) -> np.ndarray:
    qs = rng.integers(-127, 128, size=(nb, 32)).astype(np.int8).view(np.uint8)
    d = _super_scale(rng, nb, std, np.sqrt((255**2 - 1) / 12.0))
    return np.concatenate([_f16_bytes(d), qs], axis=1)


MAKERS = {Q.Q4_K: (q4_k, QK_K), Q.Q5_K: (q5_k, QK_K), Q.Q6_K: (q6_k, QK_K), Q.Q8_0: (q8_0, 32)}


def random_rows(rng: np.random.Generator, qtype: Q, rows: int, cols: int, std: float) -> np.ndarray:
    """(rows, row_bytes) uint8 of valid `qtype` blocks for a rows x cols weight."""
    make, block = MAKERS[qtype]
    if cols % block:
        raise ValueError(f"{qtype.name} rows need a multiple of {block} values, got {cols}")
    data = make(rng, rows * (cols // block), std)
    return data.reshape(rows, -1)
