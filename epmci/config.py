"""Settings of `epmci check` / `epmci build`: typed defaults, epmci.yaml, command-line overrides.

The defaults below are the single source of truth; the repo's epmci.yaml spells them out
(a test keeps the two equal). Precedence, lowest first: these defaults, the config file
(`--config PATH`, else the first `epmci.yaml` found in the current directory or one of its
parents), then `--set section.key=value` and the dedicated flags of the CLI.

Anything wrong in the file or an override (unknown key, wrong type, bad value) is an
InputError: exit 2 before any engine runs.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import InputError
from .perf_settings import PerfConfig, validate_perf

CONFIG_NAME = "epmci.yaml"
SUITE_NAMES = ("kernel", "layer", "prefetch-stress", "determinism", "e2e", "perf")
COMPARE_MODES = ("exact", "argmax", "kl")
LAYOUTS = ("mixed", "uniform")


@dataclass
class Tolerance:
    """An engine value e passes against the reference value r when |e - r| <= atol + rtol*|r|
    elementwise (and is not NaN). 0/0 means bit-for-bit equal (except the sign of zero)."""
    atol: float = 0.0
    rtol: float = 0.0


@dataclass
class EngineConfig:
    cmd: str | list[str] | None = None   # None: the bundled engine, `python -m engine`
    build_cmd: str | list[str] | None = None  # external engine: its build command
    build_timeout_s: float = 900.0
    timeout_s: float = 300.0             # every engine run is killed after this
    threads: int = 1                     # -t (determinism also runs another count)
    ctx: int = 512                       # -c
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class RunConfig:
    jobs: int = 0                        # engine runs at once; 0 = one per CPU
    batch: int = 8                       # -b of the layer, determinism and e2e runs
    n_predict: int = 4                   # -n of the layer, stress and determinism runs
    arena_mb: float | str = "auto"       # auto: max(arena_fraction of expert bytes, minimum + margin)
    arena_fraction: float = 0.25
    ram_budget_mb: float | None = None   # --ram-budget-mb for every paged run
    slot_align: int = 4096               # the engine's alignment of expert parts in a slot
    slot_windows: bool = True            # parts take the aligned file window covering them (O_DIRECT)


@dataclass
class PromptConfig:
    layer: str = ("The capital of France is Paris, and the capital of Japan is Tokyo. "
                  "Write one sentence about SSD caching.")
    stress: str = "Write one sentence about SSD caching, then explain why experts are paged."
    determinism: str = "The capital of France is"
    e2e: list[str] = field(default_factory=lambda: [
        "The", "a", "The capital of France is",
        "Write one sentence about SSD caching.", "請用一句話介紹你自己。"])


@dataclass
class KernelConfig:
    pairs: str | list[list[int]] = "auto"  # auto, or [[layer, expert], ...]
    rows: int = 4
    tolerance: Tolerance = field(default_factory=Tolerance)


@dataclass
class LayerConfig:
    layers: str | list[int] = "auto"  # auto: first, middle, last, and every size change
    tolerance: Tolerance = field(default_factory=Tolerance)


@dataclass
class StressConfig:
    batch: int = 2
    queue: int = 256
    stale_tokens: int = 1
    layer_ahead: int = 1
    margin_experts: int = 2          # slots above the minimum, per slot class
    layouts: list[str] = field(default_factory=lambda: list(LAYOUTS))


@dataclass
class DeterminismConfig:
    threads_alt: int = 0             # 0: 1 if engine.threads > 1, else 2


@dataclass
class E2EConfig:
    n_predict: int = 8
    compare: str = "exact"           # exact | argmax | kl; the bundled engine is always exact
    max_kl: float = 1e-4


@dataclass
class CheckConfig:
    model: str = "ci"                # preset name (made on first use) or a GGUF path
    suites: list[str] = field(default_factory=lambda: list(SUITE_NAMES))
    fast: bool = False               # skip e2e
    engine: EngineConfig = field(default_factory=EngineConfig)
    run: RunConfig = field(default_factory=RunConfig)
    prompts: PromptConfig = field(default_factory=PromptConfig)
    kernel: KernelConfig = field(default_factory=KernelConfig)
    layer: LayerConfig = field(default_factory=LayerConfig)
    prefetch_stress: StressConfig = field(default_factory=StressConfig)
    determinism: DeterminismConfig = field(default_factory=DeterminismConfig)
    e2e: E2EConfig = field(default_factory=E2EConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)   # epmci/perf_settings.py
    source: str = field(default="<defaults>", metadata={"internal": True})

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d


# --------------------------------------------------------------------- loading

def find_config(start: str | os.PathLike | None = None) -> Path | None:
    """The first epmci.yaml in `start` (default: cwd) or one of its parents."""
    d = Path(start or os.getcwd()).resolve()
    for p in (d, *d.parents):
        if (p / CONFIG_NAME).is_file():
            return p / CONFIG_NAME
    return None


def load_config(path: str | os.PathLike | None = None, overrides: dict | None = None,
                search: bool = True) -> CheckConfig:
    """Defaults <- config file <- overrides (a nested dict). `path=None` searches for
    epmci.yaml from the cwd upward when `search`."""
    data: dict = {}
    source = "<defaults>"
    if path is None and search:
        path = find_config()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise InputError(p, "config file not found")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise InputError(p, f"not valid YAML: {e}".replace("\n", " ")) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise InputError(p, "top level must be a mapping")
        data = loaded
        source = str(p)
    merged = _merge(dataclasses.asdict(CheckConfig()), data, where=source)
    if overrides:
        merged = _merge(merged, overrides, where="command line")
    merged.pop("source", None)
    cfg = _build(CheckConfig, merged, where=f"{source} + command line" if overrides else source)
    cfg.source = source
    validate(cfg)
    return cfg


def parse_set(items: list[str]) -> dict:
    """`--set a.b=value` items (value parsed as YAML) -> nested dict."""
    out: dict = {}
    for item in items or []:
        if "=" not in item:
            raise InputError(f"--set {item}", "expected KEY=VALUE (e.g. run.jobs=2)")
        key, _, raw = item.partition("=")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        set_path(out, key.strip(), value)
    return out


def set_path(d: dict, dotted: str, value) -> None:
    keys = [k for k in dotted.split(".") if k]
    if not keys:
        raise InputError("--set", f"empty key in {dotted!r}")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            raise InputError("--set", f"{dotted}: {k} is not a section")
    d[keys[-1]] = value


def _merge(base: dict, over: dict, where: str, prefix: str = "") -> dict:
    out = dict(base)
    for k, v in over.items():
        key = f"{prefix}{k}"
        if k not in base or k == "source":
            raise InputError(where, f"unknown setting {key!r}")
        if isinstance(base[k], dict) and k != "env":
            if not isinstance(v, dict):
                raise InputError(where, f"{key} must be a mapping")
            out[k] = _merge(base[k], v, where, key + ".")
        else:
            out[k] = v
    return out


def _build(cls, data: dict, where: str, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        kwargs[f.name] = _coerce(hints[f.name], data[f.name], where, prefix + f.name)
    return cls(**kwargs)


def _coerce(tp, v, where: str, key: str):
    if dataclasses.is_dataclass(tp):
        return _build(tp, v, where, key + ".")
    options = typing.get_args(tp) if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union else (tp,)
    for opt in options:
        ok, value = _try(opt, v)
        if ok:
            return value
    names = " or ".join(_tname(o) for o in options)
    raise InputError(where, f"{key} must be {names}, got {v!r}")


def _try(tp, v):
    if tp is type(None):
        return v is None, None
    if tp is bool:
        return isinstance(v, bool), v
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool), v
    if tp is float:
        if isinstance(v, str):   # YAML 1.1 reads 1e-6 (no dot) as a string
            try:
                return True, float(v)
            except ValueError:
                return False, None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        return ok, float(v) if ok else None
    if tp is str:
        return isinstance(v, str), v
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(v, list):
            return False, None
        out = []
        for x in v:
            ok, y = _try(item, x)
            if not ok:
                return False, None
            out.append(y)
        return True, out
    if origin is dict:
        if not isinstance(v, dict):
            return False, None
        return True, {str(k): str(x) for k, x in v.items()}
    return False, None


def _tname(tp) -> str:
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def validate(cfg: CheckConfig) -> None:
    w = cfg.source
    bad = [s for s in cfg.suites if s not in SUITE_NAMES]
    if bad:
        raise InputError(w, f"suites: unknown {bad} (choose from {', '.join(SUITE_NAMES)})")
    if not cfg.suites:
        raise InputError(w, "suites: empty")
    e, r = cfg.engine, cfg.run
    for key, val, lo in (("engine.threads", e.threads, 1), ("engine.ctx", e.ctx, 16),
                         ("run.jobs", r.jobs, 0), ("run.batch", r.batch, 1),
                         ("run.n_predict", r.n_predict, 1), ("run.slot_align", r.slot_align, 1),
                         ("kernel.rows", cfg.kernel.rows, 1),
                         ("prefetch_stress.batch", cfg.prefetch_stress.batch, 1),
                         ("prefetch_stress.queue", cfg.prefetch_stress.queue, 1),
                         ("prefetch_stress.stale_tokens", cfg.prefetch_stress.stale_tokens, 0),
                         ("prefetch_stress.margin_experts", cfg.prefetch_stress.margin_experts, 0),
                         ("determinism.threads_alt", cfg.determinism.threads_alt, 0),
                         ("e2e.n_predict", cfg.e2e.n_predict, 1)):
        if val < lo:
            raise InputError(w, f"{key} must be >= {lo}, got {val}")
    for key, t in (("engine.timeout_s", e.timeout_s), ("engine.build_timeout_s", e.build_timeout_s)):
        if not t > 0:
            raise InputError(w, f"{key} must be > 0, got {t}")
    if isinstance(r.arena_mb, str) and r.arena_mb != "auto":
        raise InputError(w, f"run.arena_mb must be a number of MiB or 'auto', got {r.arena_mb!r}")
    if not isinstance(r.arena_mb, str) and r.arena_mb <= 0:
        raise InputError(w, f"run.arena_mb must be > 0, got {r.arena_mb}")
    if not 0 < r.arena_fraction <= 1:
        raise InputError(w, f"run.arena_fraction must be in (0, 1], got {r.arena_fraction}")
    if isinstance(cfg.kernel.pairs, str):
        if cfg.kernel.pairs != "auto":
            raise InputError(w, f"kernel.pairs must be 'auto' or [[layer, expert], ...], got {cfg.kernel.pairs!r}")
    elif not cfg.kernel.pairs or any(len(p) != 2 for p in cfg.kernel.pairs):
        raise InputError(w, "kernel.pairs must be 'auto' or a non-empty list of [layer, expert]")
    if isinstance(cfg.layer.layers, str):
        if cfg.layer.layers != "auto":
            raise InputError(w, f"layer.layers must be 'auto' or a list of layers, got {cfg.layer.layers!r}")
    elif not cfg.layer.layers:
        raise InputError(w, "layer.layers must be 'auto' or a non-empty list")
    bad = [x for x in cfg.prefetch_stress.layouts if x not in LAYOUTS]
    if bad or not cfg.prefetch_stress.layouts:
        raise InputError(w, f"prefetch_stress.layouts must be a non-empty subset of {list(LAYOUTS)}")
    if cfg.e2e.compare not in COMPARE_MODES:
        raise InputError(w, f"e2e.compare must be one of {', '.join(COMPARE_MODES)}, got {cfg.e2e.compare!r}")
    if not cfg.e2e.max_kl >= 0:
        raise InputError(w, f"e2e.max_kl must be >= 0, got {cfg.e2e.max_kl}")
    validate_perf(cfg.perf, w)
    for key, tol in (("kernel.tolerance", cfg.kernel.tolerance), ("layer.tolerance", cfg.layer.tolerance)):
        if not (tol.atol >= 0 and tol.rtol >= 0):
            raise InputError(w, f"{key}: atol and rtol must be >= 0")
    prompts = [cfg.prompts.layer, cfg.prompts.stress, cfg.prompts.determinism, *cfg.prompts.e2e]
    if not cfg.prompts.e2e or any(not p for p in prompts):
        raise InputError(w, "prompts: every prompt must be non-empty, and e2e needs at least one")
    for key, cmd in (("engine.cmd", e.cmd), ("engine.build_cmd", e.build_cmd)):
        if cmd is not None and not (cmd if isinstance(cmd, list) else str(cmd).strip()):
            raise InputError(w, f"{key} is empty")
