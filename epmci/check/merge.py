"""The N shard reports of one check (`epmci check --shard K/N --json`) as one report: one
verdict, one set of cases, counted as an unsharded run counts them (check/shard.py).

It fails closed. A set of reports that is not one whole check -- a shard missing or given
twice, shards of another commit, model, settings or partition, a unit run by two shards or
by none, a shard that could not run -- is the merged report's tool error (exit 2) with
every reason, never a pass of fewer cases. A file that is not a shard report is bad input
(InputError: the file and the problem).

The merged report is the shards' results in plan order; the engine build, which every
shard does, is one result per build step: the worst of the shards', naming each shard that
failed it. Its meta is the last shard's (the one that ran perf, keyed to its runner) with
`shards` (each one's host, machine, seconds and verdict) in place of `shard`; its seconds
are the longest shard's (the fleet's wall time), `seconds_all_shards` their sum.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..fsutil import read_json
from .result import ERROR, FAIL, PASS, SKIP, STATUSES, CheckReport, CheckResult

WORST = (PASS, SKIP, FAIL, ERROR)        # status order, best first
SAME = ("commit", "model", "settings")     # meta.identity: what makes shards parts of one check


def read_shard(path: str | Path) -> dict:
    """A shard report from its JSON file (InputError when it is not one)."""
    data = read_json(path, "shard report")
    if data.get("format") != "epmci-check/1":
        raise InputError(str(path), "not an epmci check report (format epmci-check/1)")
    meta = data.get("meta")
    if not isinstance(meta, dict) or not isinstance(meta.get("identity", {}), dict):
        raise InputError(str(path), "its meta is not an object (not a report of epmci check)")
    shard = meta.get("shard")
    if not isinstance(shard, dict) or not all(k in shard for k in ("index", "count", "units", "assigned")):
        if data.get("tool_error"):       # a shard that could not run planned nothing: still a shard
            return data
        raise InputError(str(path), "not a shard report (run `epmci check --shard K/N --json ...`)")
    index, count = shard["index"], shard["count"]
    whole = all(isinstance(x, int) and not isinstance(x, bool) for x in (index, count))
    if not whole or not 1 <= index <= count:
        raise InputError(str(path), f"meta.shard says shard {index!r} of {count!r}: not K/N with 1 <= K <= N")
    if not all(isinstance(v, list) and all(isinstance(k, str) for k in v) for v in (shard["units"], shard["assigned"])):
        raise InputError(str(path), "meta.shard.units and .assigned must be lists of unit names")
    try:
        CheckReport.from_dict(data)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(str(path), f"a result is malformed: {type(e).__name__}: {e}") from None
    return data


def merge(reports: list[tuple[str, dict]]) -> CheckReport:
    """One report of the shards' (name, report dict) pairs."""
    if not reports:
        raise InputError("epmci merge", "no shard reports given")
    problems: list[str] = []
    shards = {}
    for name, d in reports:
        s = d.get("meta", {}).get("shard")
        if s is None:
            problems.append(f"{name}: a shard that could not run: {d.get('tool_error')}")
            continue
        if s["index"] in shards:
            problems.append(f"shard {s['index']}/{s['count']} given twice ({shards[s['index']][0]} and {name})")
            continue
        shards[s["index"]] = (name, d)
    counts = {d["meta"]["shard"]["count"] for _, d in shards.values()}
    if len(counts) > 1:
        problems.append(f"shards of different splits: {sorted(counts)} shards")
    count = max(counts, default=0)
    missing = [i for i in range(1, count + 1) if i not in shards]
    if missing:
        problems.append(f"shard(s) {', '.join(f'{i}/{count}' for i in missing)} missing: "
                        f"{len(shards)} of {count} reports given")
    problems += _differences(shards)
    problems += _coverage(shards)
    for i, (name, d) in sorted(shards.items()):
        if d.get("tool_error"):
            problems.append(f"shard {i}/{count} ({name}) could not run: {d['tool_error']}")
    merged = _combine(shards, count)
    if problems:
        merged.tool_error = "the shard reports are not one whole check: " + "; ".join(problems)
    return merged


def _differences(shards: dict[int, tuple[str, dict]]) -> list[str]:
    """Identity and partition that differ between shards, named."""
    out = []
    first_i, (first_name, first) = min(shards.items()) if shards else (0, ("", {}))
    for key in SAME:
        want = first.get("meta", {}).get("identity", {}).get(key)
        for i, (name, d) in sorted(shards.items()):
            got = d.get("meta", {}).get("identity", {}).get(key)
            if got != want:
                out.append(f"shard {i} ({name}) is of another {key} than shard {first_i}: {got!r} != {want!r}")
    units = first.get("meta", {}).get("shard", {}).get("units")
    for i, (name, d) in sorted(shards.items()):
        if d["meta"]["shard"]["units"] != units:
            out.append(f"shard {i} ({name}) planned other units than shard {first_i} ({first_name})")
    return out


def _coverage(shards: dict[int, tuple[str, dict]]) -> list[str]:
    """Every planned unit run by the one shard assigned to it, with at least one result."""
    if not shards:
        return []
    units = next(iter(shards.values()))[1]["meta"]["shard"]["units"]
    ran: dict[str, list[int]] = {}
    assigned: dict[str, list[int]] = {}
    for i, (_, d) in shards.items():
        for key in d["meta"]["shard"]["assigned"]:
            assigned.setdefault(key, []).append(i)
        for key in {r.get("unit", "") for s in d.get("suites", []) for r in s.get("results", [])
                    if s["name"] != "build"}:
            ran.setdefault(key, []).append(i)
    out = []
    for key in units:
        a, r = sorted(assigned.get(key, [])), sorted(ran.get(key, []))
        if len(a) != 1:
            out.append(f"unit {key!r} assigned to {'no shard' if not a else 'shards ' + ', '.join(map(str, a))}")
        if len(r) > 1:
            out.append(f"unit {key!r} run twice (shards {', '.join(map(str, r))})")
        elif not r and a:
            out.append(f"unit {key!r} of shard {a[0]} has no result")
    out += [f"results of unit {key!r}, which no shard planned (shards {', '.join(map(str, r))})"
            for key, r in sorted(ran.items()) if key not in units]
    return out


def _combine(shards: dict[int, tuple[str, dict]], count: int) -> CheckReport:
    parts = {i: CheckReport.from_dict(d) for i, (_, d) in shards.items()}
    last = parts[max(parts)] if parts else CheckReport()
    merged = CheckReport(meta={k: v for k, v in last.meta.items() if k != "shard"})
    for i in sorted(parts):
        for s in parts[i].suites:
            if s.name not in {x.name for x in merged.suites}:
                merged.suites.append(s)
    builds: dict[str, list[tuple[int, CheckResult]]] = {}
    for i in sorted(parts):
        for r in parts[i].results:
            if r.suite == "build":
                builds.setdefault(r.name, []).append((i, r))
            else:
                merged.results.append(r)
    merged.results[:0] = [_one_build(rs, count) for rs in builds.values()]
    merged.seconds = max((p.seconds for p in parts.values()), default=0.0)
    unit_seconds: dict[str, float] = {}
    for p in parts.values():
        unit_seconds.update(p.meta.get("unit_seconds") or {})
    merged.meta.update(
        seconds_all_shards=round(sum(p.seconds for p in parts.values()), 3), unit_seconds=unit_seconds,
        shards=[{"index": i, "report": shards[i][0], "host": p.meta.get("host"), "machine": p.meta.get("machine"),
                 "seconds": round(p.seconds, 3), "verdict": p.to_dict()["verdict"], "counts": p.counts()}
                for i, p in sorted(parts.items())])
    if parts:
        merged.started = min(p.started for p in parts.values())
    return merged


def _one_build(rs: list[tuple[int, CheckResult]], count: int) -> CheckResult:
    """Every shard's build of one step as one result: the worst status, the shards that
    failed it named, the longest time."""
    worst = max((r for _, r in rs), key=lambda r: WORST.index(r.status) if r.status in STATUSES else len(WORST))
    bad = [i for i, r in rs if r.status not in (PASS, SKIP)]
    out = CheckResult.from_dict(worst.to_dict())
    out.seconds = max(r.seconds for _, r in rs)
    out.message = (f"{worst.message} (shard {', '.join(f'{i}/{count}' for i in bad)})" if bad
                   else f"{worst.message} (each of {len(rs)} shards)")
    return out
