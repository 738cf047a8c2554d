"""Golden baselines: one YAML file per (runner profile, model identity), plus a logits side file.

    golden/<profile>/<model id>.yaml
    golden/<profile>/<model id>.<sha256[:12]>.logits

The model id is epmci.gguf.identity's (`<preset>-seed<seed>-gen<generator version>` for a model
made by epmci, else `sha256-<first 16 hex digits>`); the file's sha256 is recorded either way
and checked before anything is compared.

The YAML holds: the schema version; the engine it was recorded with (its --contract-info
name, version and contract, and the command; files recorded before engines declared
themselves name only the command, in recorded.engine) -- another engine's runs are never
compared with it; the machine fingerprint it was recorded on (epmci.machine); the
measurement settings; and per scenario the decode tok/s samples and
their median (null when recorded with --no-timing) with the share of decode time spent
waiting for reads and the machine's speed then (epmci.perf.speed; absent in files recorded
before), peak RSS, and per prompt the exact
counters of each phase and the correctness fingerprint (generated token ids, sha256 of the
logits' float32 bytes and of the generated text). Plus the reason of this recording and a
short history of earlier ones.

The side file keeps, per scenario and prompt, the first `golden_rows` logits rows from the
last prompt row on -- float32, exactly as the engine wrote them, zlib-compressed (float32 and
not float16: the ci model's vocabulary is 1024, so a few rows per prompt are a few tens of
KiB, and exact rows make the measured drift exact too; the digest in the YAML covers all
rows) -- and, for an engine with a MoE dump, the routed experts of every evaluated row of
every layer (uint16, n_layer x rows x k; the YAML holds their sha256 as routing_sha256), so a
change that moves routing is named by layer (epmci.compare.routing). Format: b"EPGL", uint32
version, uint32 header length, a JSON header {"entries": [{"key": K, "dtype": "<f4" | "<u2",
"shape": [...]}, ...]} (version 1: {"key", "rows", "n_vocab"}, float32 only), then zlib of the
entries' arrays concatenated in header order; keys "<scenario>/<prompt index>" (logits) and
"routing/<scenario>/<prompt index>". Its name carries its own sha256, and the YAML names it,
so writing the side file and then renaming the YAML into place is atomic: a reader sees the
old pair or the new pair, never a mix.

Anything wrong with a golden file (not YAML, wrong schema version, missing or mistyped field,
side file missing or not matching its digest) is an InputError naming the file: exit 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ..compare.counters import counter_changes
from ..compare.logits import drift
from ..compare.routing import routing_agreement
from ..errors import InputError
from ..fsutil import atomic_write
from .machine import mismatches

SCHEMA = 1
KIND = "epmci-golden"
HISTORY_KEEP = 10
LOGITS_MAGIC = b"EPGL"
LOGITS_VERSION = 2
ROUTING_KEY = "routing/"
ROUTING_DTYPE = "<u2"


# ------------------------------------------------------------------ paths

def golden_root(golden_dir: str, config_source: str | None) -> Path:
    """perf.golden_dir: absolute, or relative to the config file's directory (else the cwd)."""
    p = Path(golden_dir).expanduser()
    if p.is_absolute():
        return p
    if config_source and config_source != "<defaults>" and Path(config_source).exists():
        return Path(config_source).resolve().parent / p
    return Path.cwd() / p


def golden_path(root: str | os.PathLike, profile: str, model_id: str) -> Path:
    return Path(root) / profile / f"{model_id}.yaml"


# ------------------------------------------------------------------ data

@dataclass
class Golden:
    profile: str
    model: dict
    settings: dict
    scenarios: dict                                  # name -> scenario dict (see module doc)
    machine: dict | None = None
    recorded: dict = field(default_factory=dict)     # date, reason, engine, epmci, host
    history: list = field(default_factory=list)      # earlier {date, reason}, newest first
    logits: dict = field(default_factory=dict)       # "<scenario>/<i>" -> float32 (rows, n_vocab)
    routing: dict = field(default_factory=dict)      # "<scenario>/<i>" -> routed experts (n_layer, rows, k)
    path: Path | None = None
    logits_file: str | None = None
    engine: dict | None = None                       # {name, version, contract, command}; None: older file

    def engine_name(self) -> str:
        """Whose baselines these are: the engine's declared name (older files: its command)."""
        return self.engine["name"] if self.engine else str(self.recorded.get("engine", "?"))

    def foreign(self, engine: dict) -> str | None:
        """Why runs of `engine` ({name, command, ...}) must not be compared with this golden
        (None: they are its engine's). Older files know their engine by its command only."""
        ours = engine["name"] if self.engine else engine["command"]
        if ours == self.engine_name():
            return None
        return (f"{self.path.name if self.path else 'golden'} holds the baselines of engine {self.engine_name()!r}, "
                f"this check runs {ours!r}: another engine's runs are not compared with them")

    def scenario(self, name: str) -> dict | None:
        return self.scenarios.get(name)

    def rows(self, scenario: str, i: int) -> np.ndarray | None:
        return self.logits.get(f"{scenario}/{i}")

    def routes(self, scenario: str, i: int) -> np.ndarray | None:
        """The routed experts recorded for the prompt (n_layer, rows, k); None: not recorded."""
        return self.routing.get(f"{scenario}/{i}")

    def to_yaml_dict(self, logits_name: str, logits_sha: str) -> dict:
        return {
            "schema": SCHEMA,
            "kind": KIND,
            "profile": self.profile,
            "model": self.model,
            **({"engine": self.engine} if self.engine else {}),
            "recorded": self.recorded,
            "history": self.history,
            "machine": self.machine,
            "settings": self.settings,
            "logits": {"file": logits_name, "sha256": logits_sha,
                       "format": f"EPGL v{LOGITS_VERSION}: zlib-compressed logits rows and routing "
                                 "(epmci/perf/golden.py)"},
            "scenarios": self.scenarios,
        }


# ------------------------------------------------------------------ logits side file

def pack_side(logits: dict[str, np.ndarray], routing: dict[str, np.ndarray]) -> bytes:
    entries = {k: np.ascontiguousarray(a, dtype="<f4") for k, a in logits.items()}
    entries.update({ROUTING_KEY + k: np.ascontiguousarray(a, dtype=ROUTING_DTYPE) for k, a in routing.items()})
    keys = sorted(entries)
    header = json.dumps({"entries": [{"key": k, "dtype": entries[k].dtype.str, "shape": list(entries[k].shape)}
                                     for k in keys]}, sort_keys=True).encode()
    body = zlib.compress(b"".join(entries[k].tobytes() for k in keys), 9)
    return LOGITS_MAGIC + struct.pack("<II", LOGITS_VERSION, len(header)) + header + body


def routing_sha256(routes: np.ndarray) -> str:
    """The digest of a prompt's routing (n_layer, rows, k), as the YAML records it."""
    return hashlib.sha256(np.ascontiguousarray(routes, dtype=ROUTING_DTYPE).tobytes()).hexdigest()


def unpack_side(data: bytes, where: object) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(logits, routing) of a side file, version 1 or 2."""
    if len(data) < 12 or data[:4] != LOGITS_MAGIC:
        raise InputError(where, "not a golden logits file (bad magic)")
    version, hlen = struct.unpack_from("<II", data, 4)
    if version not in (1, LOGITS_VERSION):
        raise InputError(where, f"logits file version {version}, expected 1 or {LOGITS_VERSION}")
    try:
        header = json.loads(data[12:12 + hlen])
        body = zlib.decompress(data[12 + hlen:])
        entries = [(e["key"], np.dtype("<f4"), (int(e["rows"]), int(e["n_vocab"]))) if version == 1 else
                   (e["key"], np.dtype(e["dtype"]), tuple(int(d) for d in e["shape"])) for e in header["entries"]]
    except (ValueError, KeyError, TypeError, zlib.error) as e:
        raise InputError(where, f"corrupt logits file ({type(e).__name__})") from None
    logits, routing, pos = {}, {}, 0
    for key, dtype, shape in entries:
        if dtype.str not in ("<f4", ROUTING_DTYPE) or any(d < 0 for d in shape):
            raise InputError(where, f"corrupt logits file (entry {key}: dtype {dtype.str}, shape {shape})")
        n = dtype.itemsize * int(np.prod(shape))
        if pos + n > len(body):
            raise InputError(where, "corrupt logits file (truncated)")
        a = np.frombuffer(body, dtype, n // dtype.itemsize, pos).reshape(shape)
        if key.startswith(ROUTING_KEY):
            routing[key[len(ROUTING_KEY):]] = a
        else:
            logits[key] = a
        pos += n
    if pos != len(body):
        raise InputError(where, "corrupt logits file (trailing bytes)")
    return logits, routing


# ------------------------------------------------------------------ load (validated)

def _need(d, key: str, types, where: object, ctx: str):
    """d[key], which must be one of `types` (a bool is not accepted as a number)."""
    if not isinstance(d, dict) or key not in d:
        raise InputError(where, f"{ctx}{key}: missing")
    v = d[key]
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(v, allowed) or (isinstance(v, bool) and bool not in allowed):
        names = "/".join(t.__name__ for t in allowed)
        raise InputError(where, f"{ctx}{key}: expected {names}, got {type(v).__name__}")
    return v


NUM = (int, float)


def load(path: str | os.PathLike) -> Golden:
    """Read and validate a golden YAML file and its logits side file."""
    p = Path(path)
    d = _read_yaml(p)
    profile, model, settings, machine, recorded, history, engine = _header(d, p)
    scenarios = _need(d, "scenarios", dict, p, "")
    if not scenarios:
        raise InputError(p, "scenarios: empty")
    for name, s in scenarios.items():
        _check_scenario(s, f"scenarios.{name}.", len(settings["prompts"]), p)
    name, (logits, routing) = _side_file(d, p)
    for sname, s in scenarios.items():
        for i, e in enumerate(s["prompts"]):
            want, got = e.get("routing_sha256"), routing.get(f"{sname}/{i}")
            if want is not None and (got is None or routing_sha256(got) != want):
                raise InputError(p, f"scenarios.{sname}.prompts[{i}].routing_sha256: "
                                    f"{'not in the side file' if got is None else 'does not match the side file'}")
    return Golden(profile, model, settings, scenarios, machine, recorded, history, logits, routing, p, name, engine)


def _read_yaml(p: Path) -> dict:
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(p, f"cannot read golden file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(p, "golden file is not UTF-8 text") from None
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InputError(p, f"golden file is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(d, dict):
        raise InputError(p, "golden file: top level must be a mapping")
    if d.get("schema") != SCHEMA or d.get("kind", KIND) != KIND:
        raise InputError(p, f"golden schema {d.get('schema')!r}, this epmci reads schema {SCHEMA} "
                            f"(re-record it: epmci golden update --profile <profile> --reason ...)")
    return d


def _header(d: dict, p: Path) -> tuple:
    """profile, model, settings, machine, recorded, history, engine -- validated."""
    profile = _need(d, "profile", str, p, "")
    model = _need(d, "model", dict, p, "")
    for k, t in (("id", str), ("sha256", str)):
        _need(model, k, t, p, "model.")
    recorded = d.get("recorded") or {}
    history = d.get("history") or []
    if not isinstance(recorded, dict) or not isinstance(history, list):
        raise InputError(p, "recorded must be a mapping and history a list")
    machine = d.get("machine")
    if machine is not None and not isinstance(machine, dict):
        raise InputError(p, "machine: expected a mapping or null")
    engine = d.get("engine")
    if engine is not None:
        _need(engine, "name", str, p, "engine.")
    settings = _need(d, "settings", dict, p, "")
    _need(settings, "prompts", list, p, "settings.")
    for k in ("n_predict", "batch", "ctx", "threads"):
        _need(settings, k, int, p, "settings.")
    return profile, model, settings, machine, recorded, history, engine


def _check_scenario(s, ctx: str, n_prompts: int, p: Path) -> None:
    """One scenario's entry: arena, peak RSS, timing samples, and per prompt its fingerprint
    and counters (every prompt with the same phases and fields)."""
    if not isinstance(s, dict):
        raise InputError(p, f"{ctx[:-1]}: expected a mapping")
    _need(s, "arena_mb", NUM, p, ctx)
    _need(s, "peak_rss_mb", NUM, p, ctx)
    timing = s.get("timing")
    if timing is not None:
        samples = _need(timing, "samples", list, p, ctx + "timing.")
        if not samples or not all(isinstance(x, NUM) and not isinstance(x, bool) and x > 0 for x in samples):
            raise InputError(p, f"{ctx}timing.samples: expected a non-empty list of positive numbers")
        _need(timing, "median", NUM, p, ctx + "timing.")
        share = timing.get("io_wait_share")
        if share is not None and not (isinstance(share, NUM) and not isinstance(share, bool) and 0 <= share <= 1):
            raise InputError(p, f"{ctx}timing.io_wait_share: expected a number from 0 to 1 or null")
        speed = timing.get("machine_speed")
        if speed is not None and not (isinstance(speed, dict) and all(
                isinstance(speed.get(k), NUM) and not isinstance(speed.get(k), bool) and speed[k] > 0
                for k in ("cpu_ms", "disk_mib_s"))):
            raise InputError(p, f"{ctx}timing.machine_speed: expected positive cpu_ms and disk_mib_s")
    plist = _need(s, "prompts", list, p, ctx)
    if len(plist) != n_prompts:
        raise InputError(p, f"{ctx}prompts: {len(plist)} entries for {n_prompts} settings.prompts")
    for i, e in enumerate(plist):
        c = f"{ctx}prompts[{i}]."
        for k, t in (("prompt_tokens", int), ("first_tokens", list), ("logits_rows", int),
                     ("logits_sha256", str), ("text_sha256", str), ("counters", dict)):
            _need(e, k, t, p, c)
        if not isinstance(e.get("routing_sha256", ""), str):
            raise InputError(p, f"{c}routing_sha256: expected str")
        if not all(isinstance(x, int) for x in e["first_tokens"]):
            raise InputError(p, f"{c}first_tokens: expected integers")
        for phase, cs in e["counters"].items():
            if not isinstance(cs, dict) or not all(isinstance(v, NUM) for v in cs.values()):
                raise InputError(p, f"{c}counters.{phase}: expected a mapping of numbers")
        # one engine recorded every prompt: the same phases and fields each time (a file cut
        # short inside a prompt's counters still parses, with fewer)
        shape = {ph: sorted(cs) for ph, cs in e["counters"].items()}
        first = {ph: sorted(cs) for ph, cs in plist[0]["counters"].items()}
        if shape != first:
            raise InputError(p, f"{c}counters: phases or fields differ from prompts[0]'s (cut short or edited?)")


def _side_file(d: dict, p: Path):
    """(file name, (logits rows, routing)) of the side file, checked against its recorded sha256."""
    lg = _need(d, "logits", dict, p, "")
    name = _need(lg, "file", str, p, "logits.")
    sha = _need(lg, "sha256", str, p, "logits.")
    side = p.parent / name
    if Path(name).name != name:
        raise InputError(p, f"logits.file must be a file name next to the YAML, got {name!r}")
    try:
        data = side.read_bytes()
    except OSError:
        raise InputError(p, f"logits side file {name} is missing") from None
    if hashlib.sha256(data).hexdigest() != sha:
        # the YAML holds the digest, so it is named first; either file may be the damaged one
        raise InputError(p, f"logits.sha256 does not match its side file {name} (one of them is corrupt or stale)")
    return name, unpack_side(data, side)


def find(root: str | os.PathLike, profile: str, model_id: str) -> Golden | None:
    """The golden of (profile, model), None when there is none; InputError when it is unusable."""
    p = golden_path(root, profile, model_id)
    if not p.exists():
        return None
    return load(p)


# ------------------------------------------------------------------ write (atomic)

class _Dumper(yaml.SafeDumper):
    pass


def _repr_list(dumper, data):
    flow = len(data) > 0 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _repr_list)


def dump_yaml(d: dict) -> str:
    return yaml.dump(d, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def write(g: Golden, path: str | os.PathLike) -> Path:
    """Side file first (its name is its digest), then the YAML renamed into place; then the
    side files no longer referenced are removed."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = pack_side(g.logits, g.routing)
    sha = hashlib.sha256(data).hexdigest()
    stem = p.name[:-len(".yaml")] if p.name.endswith(".yaml") else p.name
    side = f"{stem}.{sha[:12]}.logits"
    atomic_write(p.parent / side, data)
    atomic_write(p, dump_yaml(g.to_yaml_dict(side, sha)).encode("utf-8"))
    for old in p.parent.glob(f"{stem}.*.logits"):
        if old.name != side:
            old.unlink(missing_ok=True)
    g.path, g.logits_file = p, side
    return p


def new_history(previous: Golden | None) -> list:
    if previous is None:
        return []
    prev = [{"date": previous.recorded.get("date"), "reason": previous.recorded.get("reason")}]
    return (prev + list(previous.history))[:HISTORY_KEEP]


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ------------------------------------------------------------------ show / diff

def render(g: Golden) -> str:
    m, r = g.model, g.recorded
    out = [f"golden {g.path}",
           f"  profile {g.profile}, model {m['id']} (sha256 {m['sha256'][:16]}..., {m.get('bytes', '?')} bytes)",
           f"  engine {g.engine_name()}" + (f" {g.engine.get('version')} (contract {g.engine.get('contract')}), "
                                             f"run as {g.engine.get('command')}" if g.engine else " (its command)"),
           f"  recorded {r.get('date', '?')} with {r.get('engine', '?')}: {r.get('reason', '')}"]
    for h in g.history:
        out.append(f"    earlier {h.get('date')}: {h.get('reason')}")
    if r.get("other_cpu_pct_max") is not None:
        out.append(f"  timed while other processes used at most {r['other_cpu_pct_max']:.0f}% of the CPU")
    if g.machine:
        mc = g.machine
        out.append(f"  machine: {mc.get('cpu_model')}, {mc.get('n_cpus')} CPUs, {mc.get('mem_total_gib')} GiB"
                   f"{', cgroup limit ' + str(mc.get('mem_limit_gib')) + ' GiB' if mc.get('mem_limit_gib') else ''}, "
                   f"kernel {mc.get('kernel')}, {mc.get('fs_type')} on {mc.get('disk')}")
    else:
        out.append("  machine: not recorded (no timing baseline)")
    s = g.settings
    out.append(f"  settings: {len(s['prompts'])} prompts, -n {s['n_predict']}, -b {s['batch']}, -c {s['ctx']}, "
               f"-t {s['threads']}, --ram-budget-mb {s.get('ram_budget_mb')}")
    for name, sc in g.scenarios.items():
        t = sc.get("timing")
        tt = (f"decode {t['median']:.2f} tok/s (median of {len(t['samples'])}: "
              f"{', '.join(f'{x:.2f}' for x in t['samples'])})" if t else "no timing")
        if t and t.get("io_wait_share") is not None:
            tt += f", {100 * t['io_wait_share']:.0f} % of it waiting for reads"
        if t and t.get("machine_speed"):
            tt += (f", machine then: CPU workload {t['machine_speed']['cpu_ms']:.1f} ms, disk "
                   f"{t['machine_speed']['disk_mib_s']:.0f} MiB/s")
        out.append(f"  scenario {name}: arena {sc['arena_mb']:.2f} MiB, {tt}, peak RSS {sc['peak_rss_mb']:.0f} MiB")
        for i, e in enumerate(sc["prompts"]):
            d = e["counters"].get("decode", {})
            r = g.routes(name, i)
            out.append(f"    prompt {i + 1} {s['prompts'][i][:30]!r}: {e['prompt_tokens']} prompt tokens, "
                       f"first tokens {e['first_tokens'][:8]}..., logits {e['logits_sha256'][:16]}..., "
                       + ("no routing" if r is None else f"routing {r.shape[0]} layers x {r.shape[1]} rows"))
            if d:
                out.append(f"      decode: hits {d.get('hits')} misses {d.get('misses')} evictions "
                           f"{d.get('evictions')} ssd_bytes/token {d.get('ssd_bytes_per_token')} "
                           f"prefetch used/issued {d.get('prefetch_used')}/{d.get('prefetch_issued')}")
    return "\n".join(out)


def diff(a: Golden, b: Golden) -> list[str]:
    """What changed from golden a to golden b, one line per difference."""
    out = []
    if a.engine_name() != b.engine_name():
        out.append(f"engine: {a.engine_name()} -> {b.engine_name()}")
    if a.model.get("sha256") != b.model.get("sha256"):
        out.append(f"model: {a.model['id']} ({a.model['sha256'][:12]}) -> {b.model['id']} ({b.model['sha256'][:12]})")
    for k in sorted(set(a.settings) | set(b.settings)):
        if a.settings.get(k) != b.settings.get(k):
            out.append(f"settings.{k}: {a.settings.get(k)!r} -> {b.settings.get(k)!r}")
    if a.machine and b.machine:
        out += [f"machine {x}" for x in mismatches(a.machine, b.machine)]
    elif bool(a.machine) != bool(b.machine):
        out.append(f"machine: {'recorded' if a.machine else 'none'} -> {'recorded' if b.machine else 'none'}")
    for name in list(a.scenarios) + [n for n in b.scenarios if n not in a.scenarios]:
        sa, sb = a.scenarios.get(name), b.scenarios.get(name)
        if sa is None or sb is None:
            out.append(f"scenario {name}: {'added' if sa is None else 'removed'}")
            continue
        ta, tb = sa.get("timing"), sb.get("timing")
        if ta and tb and ta["samples"] != tb["samples"]:
            out.append(f"scenario {name}: decode tok/s median {ta['median']:.2f} -> {tb['median']:.2f} "
                       f"(x{tb['median'] / ta['median']:.3f})")
        elif bool(ta) != bool(tb):
            out.append(f"scenario {name}: timing {'recorded' if ta else 'none'} -> {'recorded' if tb else 'none'}")
        if sa["peak_rss_mb"] != sb["peak_rss_mb"]:
            out.append(f"scenario {name}: peak RSS {sa['peak_rss_mb']} -> {sb['peak_rss_mb']} MiB")
        if sa["arena_mb"] != sb["arena_mb"]:
            out.append(f"scenario {name}: arena {sa['arena_mb']} -> {sb['arena_mb']} MiB")
        for i, (ea, eb) in enumerate(zip(sa["prompts"], sb["prompts"])):
            tag = f"scenario {name} prompt {i + 1}"
            for ch in counter_changes(ea["counters"], eb["counters"]):
                out.append(f"{tag}: {ch.text()} [{ch.kind}]")
            if ea["first_tokens"] != eb["first_tokens"]:
                k = next((j for j, (x, y) in enumerate(zip(ea["first_tokens"], eb["first_tokens"])) if x != y),
                         min(len(ea["first_tokens"]), len(eb["first_tokens"])))
                out.append(f"{tag}: generated tokens differ from position {k}")
            if ea["logits_sha256"] != eb["logits_sha256"]:
                msg = f"{tag}: logits digest {ea['logits_sha256'][:12]} -> {eb['logits_sha256'][:12]}"
                ra, rb = a.rows(name, i), b.rows(name, i)
                if ra is not None and rb is not None:
                    msg += f"; {drift(ra, rb).drift_text()}"
                out.append(msg)
            if ea.get("routing_sha256") != eb.get("routing_sha256"):
                qa, qb = a.routes(name, i), b.routes(name, i)
                out.append(f"{tag}: " + ("routing " + ("recorded" if qb is not None else "no longer recorded")
                                         if qa is None or qb is None else
                                         routing_agreement(list(qb), list(qa), other="the old golden").text()))
    return out
