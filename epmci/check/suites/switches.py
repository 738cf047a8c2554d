"""Layer 7, switches: paged runs that together set every data-path switch of
docs/engine-contract.md (RUNS below, switches that do not interfere grouped into one run;
tests/test_switches.py fails when the contract documents a switch no run sets), each
on a short prompt in an arena a few slots above the minimum, so experts are evicted on
every token. Every run is checked four ways:

- its switch's code ran: the branch event each switch it sets exists for (EVIDENCE: misses
  from a transient buffer, hits on pins, serial reads, predictions issued late from a full
  queue, stale prefetches, ...) is in its stats, so a run that never reached the branch
  it is there for fails instead of passing;
- correctness: the MoE dumps of the auto layers against the reference (as the layer
  suite), and the logits of every position against one resident (--no-pager) run;
- the switch's documented effect on the exact counters: every exact counter of every
  phase must be what the contract's cache policy gives on the routing the run dumped and,
  with prefetch, on the predictions it dumped, each first checked against the reference's
  router (check/cache_check.py); switches that only change how bytes move (reader threads,
  serial reads, fadvise) must also leave every counter but their own branch events equal
  to the default run's;
- the switch itself took effect where the stats can show it (an arena from SDQ_ARENA_MB,
  exact reads moving no padding, uniform slots, -b's micro-batches, no prefetch issued).

Catches paging faults that exist only on a configuration branch the other suites never
take: the transient-buffer path of admission, hot pins, serial or single-threaded reads,
exact buffered reads, fadvise, other prefetch distances, a tiny prefetch queue, -b 1 and
odd micro-batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ...compare.counters import counter_changes
from ...compare.logits import compare_logits
from ...contract.outputs import BRANCH_EVENTS, ContractError, counters_of, prompt_tokens, read_logits, read_profile
from ...contract.runspec import LOGITS_FILE, STATS_FILE
from ...errors import InputError
from ...units import MiB, arena_mib
from ..cache_check import CacheSetup, counter_problems, prefetch_env
from ..capabilities import lacks
from ..context import CheckContext, arena_room
from ..moe_check import check_dump
from ..order_arena import OrderArena, order_arena
from ..plan import CONTRACT_LAYER_AHEAD
from ..result import FAIL, PASS, SKIP, CheckResult
from ..routing import dumped_lookups
from .base import Task, run_failed
from .layer import check_layers

NAME = "switches"
PROFILE = "{profile}"       # env placeholder: the default run's --profile-out file
ARENA = "{arena}"           # env placeholder: the run's arena (SDQ_ARENA_MB; --arena-mb then asks for twice it)
HOT_PIN = "{hot_pin}"       # env placeholder: switches.hot_pin (the arena gets that many slots more per class)
FAR = "{far_layer_ahead}"   # env placeholder: the plan's queue-run distance (check/plan.py)
FARTHEST = "{farthest_layer_ahead}"   # env placeholder: the farthest distance the model predicts
QUEUE = "{small_queue}"     # env placeholder: the plan's small queue
PREFETCH = "prefetch"       # the invariant of a prefetching run: prefetches were issued


@dataclass(frozen=True)
class SwitchRun:
    name: str
    env: dict = field(default_factory=dict)
    batch: int | None = None       # None: switches.batch (the hot-pin run: the plan's)
    prefetch: bool = True          # False: --no-prefetch
    expect: str = "prefetch"       # simulated | like-default | prefetch (the counters' invariants)
    margin_in_every_class: bool = False   # its arena leaves every slot class the margin, not only the total
    minimum_arena: bool = False           # its arena is the minimum, no margin
    order_decides: bool = False           # its arena: where the eviction order decides (check/order_arena.py)


RUNS = [
    SwitchRun("default", {}, expect="prefetch"),
    SwitchRun("serial reads, one reader, fadvise",
              {"SDQ_IO_PARALLEL": "0", "SDQ_IO_THREADS": "1", "SDQ_FADV_DONTNEED": "1"}, expect="like-default"),
    SwitchRun("admit=2, -b 1", {"SDQ_ADMIT_MIN_HITS": "2"}, batch=1, prefetch=False, expect="simulated"),
    SwitchRun("admit=3, -b 3, exact reads, SDQ_ARENA_MB",
              {"SDQ_ADMIT_MIN_HITS": "3", "SDQ_DIRECT_IO": "0", "SDQ_ARENA_MB": ARENA, "SDQ_PREFETCH": "0"},
              batch=3, expect="simulated"),
    SwitchRun("hot pins, uniform slots",
              {"SDQ_HOT_PIN": HOT_PIN, "SDQ_PROFILE_IN": PROFILE, "SDQ_FORCE_UNIFORM_SLOT": "1",
               "SDQ_PREFETCH": "0"}, expect="simulated"),
    SwitchRun("layer-ahead 0, stale 0", {"SDQ_PREFETCH_LAYER_AHEAD": "0", "SDQ_PREFETCH_STALE_TOKENS": "0"},
              batch=3),
    # a queue smaller than a micro-batch's predictions, made up to two layers ahead: they
    # outlive the layer they were made at, so queued ones are issued late (with layer-ahead 0
    # a queued prediction is dropped at its own lookup, and a wrong late-issue path could
    # never show); the plan picks both from the model (check/plan.py)
    SwitchRun("far layer-ahead, small queue", {"SDQ_PREFETCH_LAYER_AHEAD": FAR, "SDQ_PREFETCH_QUEUE": QUEUE}),
    # every distance the model predicts at runs somewhere: planned only where no run above
    # reaches the farthest (CheckPlan.farthest_run)
    SwitchRun("farthest layer-ahead", {"SDQ_PREFETCH_LAYER_AHEAD": FARTHEST}),
    # where no lookup can consume a prefetch before the predicted layer's start (2 layers),
    # only an eviction frees the queue: one slot class, no margin (CheckPlan.queue_by_eviction)
    SwitchRun("small queue freed by evictions", {"SDQ_PREFETCH_LAYER_AHEAD": FAR, "SDQ_PREFETCH_QUEUE": QUEUE,
                                                 "SDQ_FORCE_UNIFORM_SLOT": "1"}, minimum_arena=True),
    # where the runs above leave the small slot class at its need (CheckPlan.class_margin_run)
    SwitchRun("a margin in every slot class", {}, margin_in_every_class=True),
    # the arenas above can all be ones where the LRU order changes no count: this one is
    # chosen on the default run's routing so it does (no prefetch: nothing else evicts)
    SwitchRun("an arena where the eviction order decides", {"SDQ_FORCE_UNIFORM_SLOT": "1"}, prefetch=False,
              expect="simulated", order_decides=True),
]
COUNTER_FIELDS = ("hits", "misses", "evictions", "ssd_bytes")


@dataclass(frozen=True)
class Evidence:
    """What a run that sets a switch to a value selecting its branch must show in its stats
    (docs/engine-contract.md, Stats: branch events), or it never reached that code."""
    event: str                 # the stats field
    text: str                  # the rule, for the message
    selects: Callable[[str], bool] = lambda v: True    # the value takes the switch's branch

    def holds(self, value: str, totals: dict) -> bool:
        n = totals.get(self.event, 0)
        if self.event == "prefetch_layers_ahead":       # D layers ahead on every prediction
            return totals.get("prefetch_predictions", 0) > 0 and n == int(value) * totals["prefetch_predictions"]
        if self.event == "prefetch_predictions":        # SDQ_PREFETCH=0: none
            return n == 0
        return n > 0


# The branch event of each switch of the Environment table (tests/test_switches.py holds every
# documented switch to having one). Switches whose effect is a number the stats report
# directly are checked by _simulated (SDQ_ARENA_MB: arena_mb, SDQ_FORCE_UNIFORM_SLOT:
# n_slots_small, SDQ_DIRECT_IO=0: io_bytes = ssd_bytes); SDQ_IO_THREADS changes who reads,
# not what or how much, so its evidence is every counter equal to the default run's.
EVIDENCE = {
    "SDQ_ADMIT_MIN_HITS": Evidence("transient_reads", "misses computed from a transient buffer > 0",
                                   lambda v: int(v) > 1),
    "SDQ_HOT_PIN": Evidence("pinned_hits", "hits on pinned slots > 0", lambda v: int(v) > 0),
    "SDQ_PROFILE_IN": Evidence("pinned_hits", "hits on pinned slots > 0"),
    "SDQ_IO_PARALLEL": Evidence("serial_reads", "expert reads done range after range > 0", lambda v: v == "0"),
    "SDQ_FADV_DONTNEED": Evidence("fadvise_ranges", "ranges dropped from the page cache > 0", lambda v: v == "1"),
    "SDQ_PREFETCH": Evidence("prefetch_predictions", "no predictions at all", lambda v: v == "0"),
    "SDQ_PREFETCH_LAYER_AHEAD": Evidence("prefetch_layers_ahead", "every prediction made D layers ahead"),
    "SDQ_PREFETCH_QUEUE": Evidence("prefetch_late", "predictions issued after waiting for the queue > 0"),
    "SDQ_PREFETCH_STALE_TOKENS": Evidence("prefetch_stale", "outstanding prefetches gone stale > 0"),
}
CHECKED_IN_SIMULATION = ("SDQ_ARENA_MB", "SDQ_FORCE_UNIFORM_SLOT", "SDQ_DIRECT_IO")
NO_EVENT = ("SDQ_IO_THREADS",)


class SwitchesSuite:
    name = NAME
    title = "switches: one paged run per data-path switch, vs the reference, resident logits and the cache policy"
    description = __doc__
    requires = ("pager", "moe_dump")

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        layers = [l for l in check_layers(ctx) if 0 <= l < ctx.facts.n_layer]
        wanted = ctx.cfg.switches.runs
        unknown = [n for n in wanted if n not in {r.name for r in RUNS}]
        if unknown:
            raise InputError(ctx.cfg.source, f"switches.runs: unknown {unknown} (runs: {', '.join(r.name for r in RUNS)})")
        out: list[Task | CheckResult] = []
        for r in RUNS:
            if wanted and r.name not in wanted:
                continue
            missing = ctx.caps.lacking(("profile",) if PROFILE in r.env.values() else ())
            if missing:
                out.append(lacks(NAME, r.name, missing, ctx.caps))
                continue
            if (FARTHEST in r.env.values() and not ctx.plan.farthest_run or
                    r.margin_in_every_class and not ctx.plan.class_margin_run or
                    r.minimum_arena and not ctx.plan.queue_by_eviction) and r.name not in wanted:
                continue       # the other runs reach that branch already
            if r.margin_in_every_class:
                too_big = self.margin_beyond_memory(ctx, r)
                if too_big:
                    out.append(CheckResult(NAME, r.name, SKIP, too_big, {"skipped_by": "memory"}))
                    continue
            if r.order_decides and ctx.facts.n_expert * ctx.facts.n_layer <= self.batch_need(ctx, r):
                out.append(CheckResult(NAME, r.name, SKIP, f"all {ctx.facts.n_expert * ctx.facts.n_layer} experts "
                                       f"are one micro-batch's need: nothing is ever evicted", {"skipped_by": "model"}))
                continue
            if FAR in r.env.values() and ctx.plan.far_layer_ahead == 0:
                out.append(CheckResult(NAME, r.name, SKIP, f"a {ctx.facts.n_layer}-layer model has no layer ahead "
                                       f"to predict", {"skipped_by": "model"}))
                continue
            out.append(Task(NAME, r.name, lambda r=r: [self.check(ctx, r, layers)], names=[r.name], cost=1.5))
            out += [CheckResult(NAME, f"{r.name}: {branch}", SKIP, why, {"skipped_by": "model"})
                    for branch, why in self.unreachable(ctx, r).items()]
        return out

    def margin_beyond_memory(self, ctx: CheckContext, r: SwitchRun) -> str | None:
        """Why the margin run cannot run here: its arena is more than the memory leaves a run
        (a model with few large-slot layers needs many times the minimum arena for it)."""
        batch = self.batch(ctx, r)
        arena, room = self._arena_of(ctx, r, batch), arena_room(ctx.cfg, ctx.facts, batch, ctx.memory.capacity)
        if room is None or arena <= room:
            return None
        return (f"the smallest arena leaving every slot class {ctx.cfg.switches.margin_experts} slots above its "
                f"need at -b {batch} is {arena:.1f} MiB, more than the {room:.1f} MiB this check's memory leaves "
                f"a run: the slot plan's proportional branch cannot be run here")

    def batch_need(self, ctx: CheckContext, r: SwitchRun) -> int:
        """The slots one micro-batch of the run's takes in one layer."""
        return min(ctx.facts.n_expert, self.batch(ctx, r) * ctx.facts.n_expert_used)

    def order_arena(self, ctx: CheckContext, r: SwitchRun) -> OrderArena | CheckResult:
        """The order run's arena, chosen on the default run's routing (the same -b, so the same
        lookups); a FAIL when that run failed, a SKIP when the memory or the routing leaves none."""
        def choose():
            run, ddir, _ = self._default(ctx)
            if not run.ok:
                return CheckResult(NAME, r.name, FAIL, f"the default run whose routing chooses this run's arena "
                                                       f"failed: {run.failure()}")
            batch, slot = self.batch(ctx, r), max(ctx.facts.slot_bytes)
            room = arena_room(ctx.cfg, ctx.facts, batch, ctx.memory.capacity)
            most = None if room is None else int(room * MiB) // slot
            if most is not None and most <= self.batch_need(ctx, r):
                return CheckResult(NAME, r.name, SKIP, f"the {room:.1f} MiB this check's memory leaves a run hold "
                                   f"{most} uniform slots, no more than a micro-batch's need", {"skipped_by": "memory"})
            try:
                lookups, _ = dumped_lookups(ctx.facts, ddir / "moe", prompt_tokens(ctx.stats(ddir / STATS_FILE)))
            except ContractError as e:
                return CheckResult(NAME, r.name, FAIL, f"the default run's output, whose routing chooses this run's "
                                                       f"arena, is unusable: {e}")
            got = order_arena(ctx.facts, lookups, batch, most)
            return got if got.slots is not None else CheckResult(NAME, r.name, SKIP, got.reason(),
                                                                 {"skipped_by": "model"})
        return ctx.shared("switches-order-arena", choose)

    # -------------------------------------------------------------- the plan's settings

    @staticmethod
    def env(ctx: CheckContext, r: SwitchRun) -> dict[str, str]:
        """The run's switches with the plan's values (the arena and profile stay placeholders)."""
        p = ctx.plan
        return {k: v.replace(HOT_PIN, str(ctx.cfg.switches.hot_pin)).replace(FARTHEST, str(p.farthest_layer_ahead))
               .replace(FAR, str(p.far_layer_ahead)).replace(QUEUE, str(p.small_queue)) for k, v in r.env.items()}

    @staticmethod
    def batch(ctx: CheckContext, r: SwitchRun) -> int:
        if HOT_PIN in r.env.values() and ctx.plan.hot_pin_batch is not None:
            return ctx.plan.hot_pin_batch
        return r.batch or ctx.cfg.switches.batch

    def unreachable(self, ctx: CheckContext, r: SwitchRun) -> dict[str, str]:
        """The run's branches this model cannot reach (check/plan.py), each with why: a
        switch's branch event, and "prefetch" (a prefetching run issued prefetches)."""
        env = self.env(ctx, r)
        distance = int(env.get("SDQ_PREFETCH_LAYER_AHEAD", CONTRACT_LAYER_AHEAD))
        out = {k: why for k, v in env.items() if k in EVIDENCE and EVIDENCE[k].selects(v)
               for why in [ctx.plan.unreachable(ctx.facts, k, v, distance)] if why}
        prefetching = r.prefetch and env.get("SDQ_PREFETCH") != "0" and r.expect == "prefetch"
        why = ctx.plan.prefetch_reason(ctx.facts, distance) if prefetching else None
        if why:
            out[PREFETCH] = why
        return out

    # -------------------------------------------------------------- shared runs

    def _dir(self, ctx: CheckContext, name: str):
        return ctx.dir("switches-" + "".join(c if c.isalnum() else "-" for c in name))

    def _run(self, ctx: CheckContext, r: SwitchRun):
        sw = ctx.cfg.switches
        batch = self.batch(ctx, r)
        arena = self._arena_of(ctx, r, batch)
        out = self._dir(ctx, r.name)
        env = {"SDQ_MOE_DUMP": str(out / "moe"), **prefetch_env(ctx, out)}
        for k, v in self.env(ctx, r).items():
            v = v.replace(ARENA, f"{arena:.6f}")
            if PROFILE in v:
                v = str(self._default(ctx)[1] / "routing.profile")
            env[k] = v
        spec = ctx.spec(ctx.cfg.prompts.switches, n_predict=sw.n_predict, batch=batch, prefetch=r.prefetch,
                        arena_mb=2 * arena if ARENA in r.env.values() else arena)
        if r.name == "default" and ctx.engine.has("profile"):
            spec.profile_out = str(out / "routing.profile")
        return ctx.run(f"switches {r.name}", spec, out, env=env), out, arena

    def _default(self, ctx: CheckContext):
        return ctx.shared("switches-default", lambda: self._run(ctx, RUNS[0]))

    def _resident(self, ctx: CheckContext):
        def run():
            out = self._dir(ctx, "resident")
            sw = ctx.cfg.switches
            spec = ctx.spec(ctx.cfg.prompts.switches, n_predict=sw.n_predict, batch=sw.batch, pager=False)
            return ctx.run("switches resident", spec, out), out
        return ctx.shared("switches-resident", run)

    # -------------------------------------------------------------- one run

    def check(self, ctx: CheckContext, r: SwitchRun, layers: list[int]) -> CheckResult:
        order = self.order_arena(ctx, r) if r.order_decides else None
        if isinstance(order, CheckResult):
            return order
        run, out, arena = self._default(ctx) if r.name == "default" else self._run(ctx, r)
        if not run.ok:
            return run_failed(NAME, [r.name], run)[0]
        t0 = time.perf_counter()
        skipped = self.unreachable(ctx, r)
        props: dict = {"env": self.env(ctx, r), "batch": self.batch(ctx, r), "unreachable": skipped,
                       "prefetch": r.prefetch, "arena_mb": round(arena, 6), "expect": r.expect}
        if order:
            props["order_arena"] = {"slots": order.slots, "alternatives_told": list(order.told),
                                    "slots_tried": list(order.tried)}

        def result(status: str, msg: str) -> CheckResult:
            return CheckResult(NAME, r.name, status, msg, props, run.seconds + time.perf_counter() - t0,
                               run.stderr_tail(), f"command: {run.command_line()}")

        if run.slot_errors:
            return result(FAIL, f"engine reported a slot error: {run.slot_errors[0]}")
        resident, rdir = self._resident(ctx)
        if not resident.ok:
            return result(FAIL, f"the resident (--no-pager) run it is compared with failed: {resident.failure()}")
        try:
            stats = ctx.stats(out / STATS_FILE)
            logits, rlogits = read_logits(out / LOGITS_FILE), read_logits(rdir / LOGITS_FILE)
        except ContractError as e:
            return result(FAIL, f"output unusable: {e}")
        problems: list[str] = []
        # 1. correctness
        prompt = prompt_tokens(stats)
        for il in layers:
            d = check_dump(ctx, NAME, r.name, out / f"moe.{il}", il, ctx.cfg.layer.tolerance, logits.shape[0])
            if d.status != PASS:
                problems.append(d.message)
                break
        diff, rule = compare_logits(rlogits, logits), ctx.logits_rule("itself")
        props.update({f"logits_{k}": v for k, v in diff.props().items()})
        if not diff.passes(rule):
            problems.append(f"logits differ from the resident run ({rule.text()}): {diff.text()}")
        if run.stdout != resident.stdout and rule.mode == "exact":
            problems.append("generated text differs from the resident run's")
        # 2. the switch's code ran, 3. the counters the switch promises and its effect
        problems += self._evidence(self.env(ctx, r), r.prefetch, stats, props, skipped)
        try:
            problems += self._counters(ctx, r, out, stats, prompt, props, skipped)
        except ContractError as e:
            problems.append(f"output unusable: {e}")
        if problems:
            return result(FAIL, "; ".join(problems))
        c = props.get("decode", {})
        return result(PASS, f"{len(layers)} layers' MoE = reference, logits = resident ({diff.text()}), counters "
                            f"checked against {props.get('counters_oracle')}{' and the default run' if r.expect == 'like-default' else ''}"
                            f" (decode: {c.get('hits')} hits, {c.get('misses')} misses, {c.get('evictions')} evictions)")

    @staticmethod
    def _evidence(env: dict[str, str], prefetch: bool, stats: list[dict], props: dict,
                  skipped: dict[str, str]) -> list[str]:
        """Every switch the run sets left its branch event in the stats (summed over phases),
        but those this model cannot reach (`skipped`, reported as skips of their own)."""
        totals = {e: sum(int(s.get(e, 0)) for s in stats) for e in BRANCH_EVENTS}
        props["branch_events"] = totals
        env = dict(env)
        if not prefetch:                       # --no-prefetch: as SDQ_PREFETCH=0
            env.setdefault("SDQ_PREFETCH", "0")
        own = {k: v for k, v in env.items() if k in EVIDENCE and EVIDENCE[k].selects(v) and k not in skipped}
        props["branch_evidence"] = {k: f"{EVIDENCE[k].event}={totals.get(EVIDENCE[k].event, 0)}" for k in own}
        missing = [f"{k}={v}: {EVIDENCE[k].text}, but {EVIDENCE[k].event} = {totals.get(EVIDENCE[k].event, 0)}"
                   for k, v in own.items() if not EVIDENCE[k].holds(v, totals)]
        return [f"the run did not reach its switch's branch ({'; '.join(missing)})"] if missing else []

    def _counters(self, ctx: CheckContext, r: SwitchRun, out, stats: list[dict], prompt: int,
                  props: dict, skipped: dict[str, str]) -> list[str]:
        by_phase = {s["phase"]: s for s in stats}
        for ph, s in by_phase.items():
            props[ph] = {k: s.get(k) for k in (*COUNTER_FIELDS, "prefetch_issued", "prefetch_used", "n_slots")}
        env = self.env(ctx, r)
        exact_reads = env.get("SDQ_DIRECT_IO") == "0"
        facts = ctx.facts if not exact_reads else type(ctx.facts).of(ctx.mf, ctx.cfg.run.slot_align, windows=False)
        setup = CacheSetup.of(ctx, env, self.batch(ctx, r), r.prefetch, self._pins(ctx, r))
        problems = counter_problems(ctx, out, stats, setup, props, facts, ctx.cfg.prompts.switches)
        if r.expect == "like-default":
            default_run, ddir, _ = self._default(ctx)
            if not default_run.ok:
                return problems + [f"the default run it is compared with failed: {default_run.failure()}"]
            own = {f"{ph}.{EVIDENCE[k].event}" for k in r.env if k in EVIDENCE for ph in ("prefill", "decode")}
            changes = [c for c in counter_changes(counters_of(ctx.stats(ddir / STATS_FILE)), counters_of(stats))
                       if c.key not in own]
            if changes:
                problems.append("these switches must not change any counter but their own branch events, but: "
                                + "; ".join(c.text() for c in changes[:4]))
        elif r.expect == "prefetch":
            if sum(s.get("prefetch_issued", 0) for s in stats) <= 0 and PREFETCH not in skipped:
                problems.append("no prefetch was issued: the prefetch path of these settings did not run")
        for s in stats:
            if exact_reads and (s.get("io_bytes") != s.get("ssd_bytes") or s.get("io_direct_pct", 0) != 0):
                problems.append(f"{s['phase']}: SDQ_DIRECT_IO=0 reads exactly the experts' bytes through the page "
                                f"cache, but io_bytes {s.get('io_bytes')} vs ssd_bytes {s.get('ssd_bytes')}, "
                                f"io_direct_pct {s.get('io_direct_pct')}")
        if ARENA in r.env.values():
            asked = self._arena_of(ctx, r, setup.batch)
            if float(stats[0].get("arena_mb", 0)) > asked + 1e-3:
                problems.append(f"SDQ_ARENA_MB={asked:.6f} must override --arena-mb {2 * asked:.6f}, but the arena "
                                f"is {stats[0].get('arena_mb')} MiB")
        return problems

    def _pins(self, ctx: CheckContext, r: SwitchRun) -> list:
        """The hot-pin run's pins: the default run's profile, hottest first."""
        if "SDQ_HOT_PIN" not in r.env:
            return []
        _, ddir, _ = self._default(ctx)
        return [(l, e) for l, e, _ in read_profile(ddir / "routing.profile")[:ctx.cfg.switches.hot_pin]]

    def _arena_of(self, ctx: CheckContext, r: SwitchRun, batch: int) -> float:
        """The minimum arena of the run's batch and layout, margin_experts slots' bytes above
        it per class (and room for the pins of a hot-pin run, which never leave their slots);
        a margin_in_every_class run's: the smallest that leaves each class that many slots; a
        minimum_arena run's: the minimum; an order_decides run's: its chosen slots."""
        sw = ctx.cfg.switches
        if r.order_decides:
            return arena_mib(self.order_arena(ctx, r).slots * max(ctx.facts.slot_bytes))
        uniform = r.env.get("SDQ_FORCE_UNIFORM_SLOT") == "1"
        extra = sw.hot_pin if HOT_PIN in r.env.values() else 0
        margin = 0 if r.minimum_arena else sw.margin_experts
        arena = ctx.facts.margin_arena_bytes if r.margin_in_every_class else ctx.facts.min_arena_bytes
        return arena_mib(arena(batch, uniform, margin + extra))


SUITE = SwitchesSuite()
