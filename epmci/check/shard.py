"""One check split over N machines: `epmci check --shard K/N` runs the K-th of N disjoint
parts of the check's plan, and `epmci merge` (check/merge.py) makes one verdict of them.

The part a shard runs whole is a unit: one planned task (its engine runs and the verdicts
decided from them) or one ready result (a skip decided at planning). A suite whose runs
must share one machine is one unit, and says why (`Suite.together`): perf, whose base and
head are timed on the same runner and whose golden timing is keyed to the runner's profile.
Units that time engines go to the last shard, so a workflow sends shard N to the runner
whose profile the golden baselines were recorded on and the others anywhere.

Units are assigned longest first to the least loaded shard (LPT; ties by key), from the
plan alone: every machine given the same model, settings, commit and durations computes
the same partition. A unit's length is its seconds in an earlier report (`--durations`,
`meta.unit_seconds` of any check or merge report), else its task's estimated engine runs
(`Task.cost`) at the seconds per run the known units show (1 when none is known).
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..fsutil import read_json


@dataclass(frozen=True)
class Shard:
    index: int       # 1-based
    count: int

    @classmethod
    def parse(cls, text: str) -> "Shard":
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
        if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
            raise InputError("--shard", f"must be K/N with 1 <= K <= N, got {text!r}")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class Unit:
    key: str                 # "suite/task name", or the suite's name when it runs whole
    cost: float              # estimated engine runs (Task.cost; 0 for a ready result)
    timed: bool = False      # it times engines: the last shard's
    together: str = ""       # why its suite is one unit


def unit_key(suite: str, name: str, together: str) -> str:
    return suite if together else f"{suite}/{name}"


def read_durations(path: str | Path) -> dict[str, float]:
    """`meta.unit_seconds` of an earlier check or merge report: unit key -> seconds."""
    secs = read_json(path, "durations report").get("meta", {}).get("unit_seconds")
    if not isinstance(secs, dict) or not secs or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in secs.values()):
        raise InputError(str(path), "has no meta.unit_seconds (a report of `epmci check --json` or `epmci merge --json`)")
    return {str(k): float(v) for k, v in secs.items()}


def lengths(units: list[Unit], durations: dict[str, float] | None) -> dict[str, float]:
    """Each unit's expected seconds: recorded where known, else cost at the known rate."""
    known = {u.key: durations[u.key] for u in units if durations and u.key in durations}
    rates = [known[u.key] / u.cost for u in units if u.key in known and u.cost > 0]
    rate = statistics.median(rates) if rates else 1.0
    return {u.key: known.get(u.key, u.cost * rate) for u in units}


def partition(units: list[Unit], count: int, durations: dict[str, float] | None = None) -> dict[str, int]:
    """unit key -> its shard (1..count): timed units on the last shard, the rest longest
    first onto the least loaded shard."""
    length = lengths(units, durations)
    load = [0.0] * count
    out: dict[str, int] = {}
    for u in units:
        if u.timed:
            out[u.key] = count
            load[count - 1] += length[u.key]
    for u in sorted((u for u in units if not u.timed), key=lambda u: (-length[u.key], u.key)):
        k = min(range(count), key=lambda i: (load[i], i))
        out[u.key] = k + 1
        load[k] += length[u.key]
    return out


def loads(units: list[Unit], assignment: dict[str, int], count: int,
          durations: dict[str, float] | None = None) -> list[float]:
    """The expected seconds of each shard."""
    length = lengths(units, durations)
    out = [0.0] * count
    for u in units:
        out[assignment[u.key] - 1] += length[u.key]
    return out


def settings_digest(settings: dict) -> str:
    """What must be equal for shards to be parts of one check: every setting but the model
    (its file may lie elsewhere on each machine; the model's identity is compared instead)."""
    d = {k: v for k, v in settings.items() if k != "model"}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]
