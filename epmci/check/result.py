"""The result model of `epmci check`: data only, rendered by epmci.report.

A suite (kernel, layer, ..., or a later perf suite) produces CheckResults; a CheckReport
holds them with the run's metadata. Renderers only read these fields, so a new suite plugs
in without touching them.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

PASS, FAIL, SKIP, ERROR = "pass", "fail", "skip", "error"
STATUSES = (PASS, FAIL, SKIP, ERROR)


@dataclass
class CheckResult:
    suite: str                 # e.g. "kernel"
    name: str                  # e.g. "L5 E63" (unique within the suite)
    status: str                # pass | fail | skip | error
    message: str = ""          # one line, with the numbers that decided the verdict
    properties: dict = field(default_factory=dict)  # the same numbers, machine-readable
    seconds: float = 0.0
    stderr_tail: str = ""      # of the engine run(s) behind this result
    details: str = ""          # longer text (e.g. the command line); optional
    order: int = 0             # position in the plan; reports sort by (suite order, order)
    unit: str = ""             # the planned task (or ready result) it came from: what a shard runs (check/shard.py)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"bad status {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status in (PASS, SKIP)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CheckResult":
        """A result read back from a report (ValueError/KeyError/TypeError when it is not one)."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


@dataclass
class SuiteInfo:
    name: str
    title: str
    description: str = ""


@dataclass
class CheckReport:
    results: list[CheckResult] = field(default_factory=list)
    suites: list[SuiteInfo] = field(default_factory=list)   # in run order
    meta: dict = field(default_factory=dict)                # model, engine, config, timings
    started: float = field(default_factory=time.time)
    seconds: float = 0.0
    tool_error: str | None = None   # set when the tool could not run (exit 2)

    def suite_names(self) -> list[str]:
        names = [s.name for s in self.suites]
        for r in self.results:
            if r.suite not in names:
                names.append(r.suite)
        return names

    def suite_info(self, name: str) -> SuiteInfo:
        for s in self.suites:
            if s.name == name:
                return s
        return SuiteInfo(name, name)

    def by_suite(self) -> dict[str, list[CheckResult]]:
        out = {n: [] for n in self.suite_names()}
        for r in self.results:
            out[r.suite].append(r)
        for rs in out.values():
            rs.sort(key=lambda r: r.order)
        return out

    def counts(self) -> dict[str, int]:
        c = {s: 0 for s in STATUSES}
        for r in self.results:
            c[r.status] += 1
        return c

    @property
    def passed(self) -> bool:
        return self.tool_error is None and all(r.ok for r in self.results) and bool(self.results)

    @property
    def exit_code(self) -> int:
        """0 all passed (or skipped), 1 a check failed or errored, 2 the tool could not run."""
        if self.tool_error is not None:
            return 2
        return 0 if self.passed else 1

    @property
    def verdict(self) -> str:
        return {0: "PASS", 1: "FAIL", 2: "ERROR"}[self.exit_code]

    @classmethod
    def from_dict(cls, d: dict) -> "CheckReport":
        """A report read back from its JSON document (epmci merge); the inverse of to_dict
        for everything but the derived fields (verdict, counts)."""
        rep = cls(meta=dict(d.get("meta") or {}), seconds=float(d.get("seconds") or 0.0),
                  tool_error=d.get("tool_error"))
        for s in d.get("suites") or []:
            rep.suites.append(SuiteInfo(s["name"], s.get("title", s["name"])))
            rep.results += [CheckResult.from_dict(r) for r in s.get("results") or []]
        return rep

    def to_dict(self) -> dict:
        by = self.by_suite()
        return {
            "format": "epmci-check/1",
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "tool_error": self.tool_error,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "seconds": round(self.seconds, 3),
            "counts": self.counts(),
            "meta": self.meta,
            "suites": [{"name": s, "title": self.suite_info(s).title,
                        "counts": _counts(by[s]), "results": [r.to_dict() for r in by[s]]}
                       for s in self.suite_names()],
        }


def _counts(results: list[CheckResult]) -> dict[str, int]:
    c = {s: 0 for s in STATUSES}
    for r in results:
        c[r.status] += 1
    return c
