"""Units the gate and the contract share: MiB, and an arena size as the engine's flag takes it."""

from __future__ import annotations

MiB = 1 << 20


def round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def arena_mib(n_bytes: int | float) -> float:
    """An arena of at least n_bytes as `--arena-mb` MiB: rounded up in the 6th decimal, plus
    1e-6 so the engine's `int(MiB * value)` never lands a byte short of n_bytes."""
    n = int(n_bytes)
    return (n * 1_000_000 + MiB - 1) // MiB / 1_000_000 + 1e-6


def arena_flag(mb: float) -> str:
    """The text of `--arena-mb` (6 decimals: the engine resolves bytes from it)."""
    return f"{mb:.6f}"
