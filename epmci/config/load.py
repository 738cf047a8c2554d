"""Loading the settings: typed defaults (epmci/config/schema.py), epmci.yaml, command-line
overrides. Precedence, lowest first: these defaults, the config file
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
from pathlib import Path

import yaml

from ..errors import InputError
from .schema import CONFIG_NAME, CheckConfig
from .validate import validate


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
