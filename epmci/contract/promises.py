"""The resource promises of a paged run (docs/engine-contract.md, Paging), checked on every
paged run that exits 0, whichever suite made it (epmci.contract.runspec.run):

- the arena: the slots per class and the bytes the engine reports are what the contract
  computes for the size asked (--arena-mb, or SDQ_ARENA_MB over it), -b and the slot layout
  (SDQ_FORCE_UNIFORM_SLOT, SDQ_DIRECT_IO) -- never measured against the engine's own count;
- the budget: peak RSS under --ram-budget-mb;
- the reads: ssd_bytes is every read's expert bytes (a read per miss and per prefetch
  issued), io_bytes at least that and at most the reads' slot windows.

A broken promise makes the run fail with both numbers, so no suite can compare results of
an engine that quietly took more memory or fewer slots than it was given.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gguf.facts import ModelFacts
from ..gguf.file import ModelFile
from ..units import MiB


@dataclass(frozen=True)
class Promises:
    """A model's facts under both slot-window rules, to check any paged run on it."""
    windows: ModelFacts          # SDQ_DIRECT_IO=1 (the default): aligned file windows, if the engine has them
    exact: ModelFacts            # SDQ_DIRECT_IO=0: every part's own bytes

    @classmethod
    def of(cls, mf: ModelFile, align: int, windows: bool = True) -> "Promises":
        return cls(ModelFacts.of(mf, align, windows), ModelFacts.of(mf, align, windows=False))

    def broken(self, *, arena_mb: float | None, batch: int, ram_budget_mb: float | None, env: dict,
               records: list[dict]) -> list[str]:
        facts = self.exact if env.get("SDQ_DIRECT_IO") == "0" else self.windows
        return broken_promises(facts, arena_mb=arena_mb, batch=batch, ram_budget_mb=ram_budget_mb, env=env,
                               records=records)


def asked_arena_bytes(arena_mb: float | None, env: dict) -> int | None:
    """The arena size the engine was asked for, resolved as the contract says the engine
    does: int(MiB * the flag's value); SDQ_ARENA_MB overrides --arena-mb."""
    value = env.get("SDQ_ARENA_MB") or (None if arena_mb is None else f"{arena_mb:.6f}")
    return None if value is None else int(float(value) * MiB)


def broken_promises(facts: ModelFacts, *, arena_mb: float | None, batch: int, ram_budget_mb: float | None,
                    env: dict, records: list[dict]) -> list[str]:
    """What the stats `records` of a paged run that exited 0 promise and break. `facts` are
    the model's under the run's SDQ_DIRECT_IO (slot windows on or off)."""
    problems: list[str] = []
    first = records[0]
    got = {"small": int(first.get("n_slots_small", 0)), "large": int(first.get("n_slots_large", 0))}
    asked = asked_arena_bytes(arena_mb, env)
    if asked is not None:
        uniform = env.get("SDQ_FORCE_UNIFORM_SLOT") == "1"
        want = facts.slot_counts(asked, batch, uniform)
        classes = facts.slot_classes(uniform)
        sizes = {"small": classes[0] if len(classes) == 2 else 0, "large": classes[-1]}
        layout = "uniform" if uniform else "mixed"
        if want is None:
            problems.append(f"arena of {asked} B at -b {batch}, {layout} slots is below the contract's minimum "
                            f"({facts.min_arena_bytes(batch, uniform)} B), yet the engine ran: it must refuse (exit 2)")
        elif got != want:
            problems.append(f"arena of {asked} B at -b {batch}, {layout} slots: the contract gives "
                            f"{want['small']} small + {want['large']} large slots, the engine reports "
                            f"{got['small']} small + {got['large']} large")
        if want is not None:
            want_mb = round(sum(n * sizes[k] for k, n in want.items()) / MiB, 3)
            if abs(float(first.get("arena_mb", 0)) - want_mb) > 5e-4:
                problems.append(f"arena_mb {first.get('arena_mb')} reported, the contract's slots take "
                                f"{want_mb} MiB of the {asked / MiB:.3f} MiB asked")
    for r in records:
        small, large = int(r.get("n_slots_small", 0)), int(r.get("n_slots_large", 0))
        if (small, large) != (got["small"], got["large"]):
            problems.append(f"{r['phase']}: {small} small + {large} large slots, the first record "
                            f"{got['small']} + {got['large']}: the arena changed during the run")
        if int(r.get("n_slots", 0)) != small + large:
            problems.append(f"{r['phase']}: n_slots {r.get('n_slots')} is not n_slots_small + n_slots_large "
                            f"({small} + {large})")
        problems += _reads(facts, r)
    if ram_budget_mb is not None:
        peak = max(float(r.get("peak_rss_mb", 0)) for r in records)
        if peak > ram_budget_mb:
            problems.append(f"peak RSS {peak} MiB is over the budget (--ram-budget-mb {ram_budget_mb:g})")
    return problems


def _reads(facts: ModelFacts, r: dict) -> list[str]:
    """ssd_bytes and io_bytes against the reads the record counts."""
    reads = int(r.get("misses", 0)) + int(r.get("prefetch_issued", 0))
    ssd, io = int(r.get("ssd_bytes", 0)), int(r.get("io_bytes", 0))
    lo, hi = reads * min(facts.expert_bytes), reads * max(facts.expert_bytes)
    out = []
    if not lo <= ssd <= hi:
        span = f"{lo} B" if lo == hi else f"{lo}..{hi} B"
        out.append(f"{r['phase']}: ssd_bytes {ssd} for {reads} reads (misses + prefetches issued) of experts of "
                   f"{sorted(set(facts.expert_bytes))} B: {span} expected")
    if not ssd <= io <= reads * max(facts.slot_bytes):
        out.append(f"{r['phase']}: io_bytes {io} outside [ssd_bytes {ssd}, {reads} reads x the largest slot "
                   f"{max(facts.slot_bytes)} B]")
    return out
