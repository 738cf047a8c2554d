"""The pager's settings: PagerConfig from the CLI values and the SDQ_* environment
(docs/engine-contract.md, "Environment"), and the routing-profile file that hot pins read."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..gguf_model import ModelError
from .cache_policy import Key

DEFAULT_ARENA_FRACTION = 0.25   # of the model's expert bytes, when no size is given


def _env_int(env, name: str, default: int, lo: int = 0) -> int:
    v = env.get(name, "")
    if v.strip() == "":
        return default
    try:
        n = int(v)
    except ValueError:
        raise ModelError(f"{name}={v!r}: must be an integer >= {lo}") from None
    if n < lo:
        raise ModelError(f"{name}={v!r}: must be an integer >= {lo}")
    return n


def _env_bool(env, name: str, default: bool) -> bool:
    v = env.get(name, "").strip()
    if v == "":
        return default
    if v not in ("0", "1"):
        raise ModelError(f"{name}={v!r}: must be 0 or 1")
    return v == "1"


@dataclass
class PagerConfig:
    arena_mb: float | None = None          # None: DEFAULT_ARENA_FRACTION of the expert bytes
    ram_budget_mb: float | None = None     # None: the memory the process has (engine/machine.py)
    force_uniform_slot: bool = False
    admit_min_hits: int = 1
    hot_pin: int = 0
    profile_in: str | None = None
    io_threads: int = 4
    io_parallel: bool = True
    fadv_dontneed: bool = False
    prefetch: bool = True
    prefetch_layer_ahead: int = 1
    prefetch_queue: int = 64
    prefetch_stale_tokens: int = 2
    direct_io: bool = True                 # read aligned windows with O_DIRECT where possible

    @classmethod
    def from_env(cls, arena_mb: float | None = None, ram_budget_mb: float | None = None,
                 prefetch: bool | None = None, env: Mapping[str, str] | None = None) -> "PagerConfig":
        """CLI values plus the SDQ_* environment (SDQ_ARENA_MB overrides arena_mb;
        prefetch=False, i.e. --no-prefetch, wins over SDQ_PREFETCH)."""
        env = os.environ if env is None else env
        if env.get("SDQ_ARENA_MB", "").strip():
            v = env["SDQ_ARENA_MB"]
            try:
                arena_mb = float(v)
            except ValueError:
                raise ModelError(f"SDQ_ARENA_MB={v!r}: must be a number of MiB") from None
        if arena_mb is not None and not arena_mb > 0:
            raise ModelError(f"arena size must be positive, got {arena_mb} MiB")
        if ram_budget_mb is not None and not ram_budget_mb > 0:
            raise ModelError(f"--ram-budget-mb: must be positive, got {ram_budget_mb}")
        pf = _env_bool(env, "SDQ_PREFETCH", True)
        if prefetch is not None:
            pf = pf and prefetch
        return cls(
            arena_mb=arena_mb,
            ram_budget_mb=ram_budget_mb,
            force_uniform_slot=_env_bool(env, "SDQ_FORCE_UNIFORM_SLOT", False),
            admit_min_hits=_env_int(env, "SDQ_ADMIT_MIN_HITS", 1, 1),
            hot_pin=_env_int(env, "SDQ_HOT_PIN", 0, 0),
            profile_in=env.get("SDQ_PROFILE_IN") or None,
            io_threads=_env_int(env, "SDQ_IO_THREADS", 4, 1),
            io_parallel=_env_bool(env, "SDQ_IO_PARALLEL", True),
            fadv_dontneed=_env_bool(env, "SDQ_FADV_DONTNEED", False),
            prefetch=pf,
            prefetch_layer_ahead=_env_int(env, "SDQ_PREFETCH_LAYER_AHEAD", 1, 0),
            prefetch_queue=_env_int(env, "SDQ_PREFETCH_QUEUE", 64, 0),
            prefetch_stale_tokens=_env_int(env, "SDQ_PREFETCH_STALE_TOKENS", 2, 0),
            direct_io=_env_bool(env, "SDQ_DIRECT_IO", True),
        )


def read_profile(path: str, n_layer: int, n_expert: int) -> list[tuple[Key, int]]:
    """A --profile-out file: `layer expert count` lines -> [((layer, expert), count)] in
    the order pins are taken (count descending, then layer, then expert)."""
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        raise ModelError(f"SDQ_PROFILE_IN {path}: {e.strerror or e}") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            layer, expert, count = (int(v) for v in line.split())
        except ValueError:
            raise ModelError(f"SDQ_PROFILE_IN {path}: line {i}: expected `layer expert count`") from None
        if not (0 <= layer < n_layer and 0 <= expert < n_expert) or count < 0:
            raise ModelError(f"SDQ_PROFILE_IN {path}: line {i}: ({layer}, {expert}, {count}) out of range")
        out.append(((layer, expert), count))
    out.sort(key=lambda kc: (-kc[1], kc[0][0], kc[0][1]))
    return out
