"""The check's plan: every setting a suite takes from the model or the machine, derived in
one place from the model's facts (layers, experts, experts used, slot sizes) and the
machine (memory, CPUs), and the rule that says which of the contract's branches a model
can reach at all.

A branch-evidence check (a run that sets SDQ_PREFETCH_QUEUE must show a prediction issued
late, ...) is only honest when the run can reach its branch. The settings here are chosen
so it does on every model that can (a prefetch distance below the layer count, a queue
smaller than a micro-batch's predictions, a batch that leaves a hot-pin run a free slot),
and `unreachable` says, from the model's facts alone, where no setting can: those checks
are SKIPPED with its reason, never FAILed. A fault in a branch the model can reach still
fails: the rule only ever names what the model's shape makes impossible.

Where the rule comes from (docs/engine-contract.md, Paging: Prefetch): at the start of
layer L the engine predicts layer T = L + D (no prediction when T is past the last layer);
a prediction that finds the queue full waits, is re-tried at every later layer start, and
is dropped at T's own lookup. So
- predictions exist only when D <= layers - 1;
- a waiting prediction can be issued late only at a layer start after L and no later than
  T, when a lookup between has consumed an outstanding prefetch: the first prediction of a
  micro-batch (L = 0) waits behind prefetches for layer D itself, so the earliest late
  issue is for a prediction made at L = 1, which needs D >= 1 and layers >= D + 2;
- a prefetch goes stale only when it was never consumed, i.e. predicted wrong: impossible
  when every token uses every expert; and a prefetch never evicts an entry of the current
  layer, so on a 1-layer model none is issued once the arena is full;
- a pin needs a slot the micro-batch's need leaves free in its class.

The thread counts determinism compares with -t: 1, 2, 3 and the runner's CPUs (the count
production runs), less -t itself. Work split into equal shares is split evenly at every
size that is a multiple of the count, and the model's sizes mostly are multiples of 2: a
fault that only loses or repeats the remainder of an uneven split (measured: a 3-layer
64-expert model passed at -t 2) shows at 3, which splits power-of-two sizes unevenly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..config.schema import CheckConfig
from ..gguf.facts import ModelFacts

CONTRACT_LAYER_AHEAD = 1     # docs/engine-contract.md: SDQ_PREFETCH_LAYER_AHEAD's default
FAR_LAYER_AHEAD = 2          # the queue run's distance where the model has the layers (switches.queue_layer_ahead)
SMALL_QUEUE = 2              # the queue run's cap where a micro-batch predicts more than it (switches.queue)
SPLIT_THREADS = (1, 2, 3)    # -t counts every check compares (with the runner's CPUs)


def predicts(n_layer: int, distance: int) -> bool:
    """Whether layer-ahead prediction at `distance` makes any prediction on the model."""
    return distance <= n_layer - 1


def reachable_distance(n_layer: int, wanted: int) -> int:
    """The largest distance <= wanted that still predicts (0 on a 1-layer model)."""
    return max(0, min(wanted, n_layer - 1))


def late_issue_reason(n_layer: int, distance: int) -> str | None:
    """Why no run must show a queued prediction issued late at this distance (None: the
    queue run must). A late issue needs room in the queue between a prediction and its
    layer's lookup: a prefetch consumed by a lookup in between (distance + 2 layers), or one
    evicted before its use -- which only a run's routing decides."""
    if distance < 1:
        return f"with layer-ahead {distance} a waiting prediction is dropped at its own layer's lookup"
    if n_layer < distance + 2:
        return (f"a {n_layer}-layer model has no lookup between a prediction {distance} layer(s) ahead and its "
                f"layer's start that could consume a prefetch (needs {distance + 2} layers): only an eviction "
                f"frees the queue, which the run's routing may or may not do (its counters are replayed either way)")
    return None


def stale_reason(facts: ModelFacts, distance: int) -> str | None:
    """Why no prefetch can go stale (None: one can)."""
    if not predicts(facts.n_layer, distance):
        return f"a {facts.n_layer}-layer model makes no prediction {distance} layer(s) ahead"
    if facts.n_layer == 1:
        return ("on a 1-layer model a prefetch may not evict (every entry is of the current layer): once the "
                "arena is full none is issued, so none can go stale")
    if facts.n_expert_used >= facts.n_expert:
        return (f"every token uses all {facts.n_expert} experts: no prediction can be wrong, so none is "
                f"left outstanding to go stale")
    return None


def pin_batch(facts: ModelFacts, wanted: int) -> int | None:
    """The largest -b <= wanted at which a pin can take a slot in the uniform layout (its
    one class holds every expert; a micro-batch's need of min(experts, b * used) slots must
    leave one); None: no batch can."""
    room = facts.n_expert * facts.n_layer
    for b in range(max(1, wanted), 0, -1):
        if min(facts.n_expert, b * facts.n_expert_used) < room:
            return b
    return None


@dataclass(frozen=True)
class CheckPlan:
    """The derived settings of one check (printed at its start, in the JSON report's meta)."""
    jobs: int                        # engine runs at once (at most)
    memory_mb: float | None          # what they may hold together (None: no limit)
    stress_layer_ahead: int          # prefetch-stress's SDQ_PREFETCH_LAYER_AHEAD
    far_layer_ahead: int             # the queue run's SDQ_PREFETCH_LAYER_AHEAD
    farthest_layer_ahead: int        # the farthest distance (<= FAR_LAYER_AHEAD) the model predicts
    class_margin_run: bool           # a run whose arena leaves every slot class a margin (see of())
    queue_by_eviction: bool          # only evictions can free the queue: a run of its own for that (see of())
    small_queue: int                 # the queue run's SDQ_PREFETCH_QUEUE
    hot_pin_batch: int | None        # -b of the hot-pin run (None: no pin can be placed)
    other_threads: tuple[int, ...] = ()   # the -t counts determinism compares with engine.threads
    model_positions: int = 2         # prompt positions of the model suite
    decode: tuple[tuple[str, int], ...] = ()   # decode steps (-n) of each kind of run
    adjusted: tuple[str, ...] = ()   # what was changed from the settings, and why

    @classmethod
    def of(cls, cfg: CheckConfig, facts: ModelFacts, jobs: int, memory_mb: float | None,
           cpus: int = 1) -> "CheckPlan":
        n, adjusted = facts.n_layer, []
        stress = reachable_distance(n, cfg.prefetch_stress.layer_ahead)
        if stress != cfg.prefetch_stress.layer_ahead:
            adjusted.append(f"prefetch-stress layer-ahead {cfg.prefetch_stress.layer_ahead} -> {stress}: "
                            f"a {n}-layer model predicts at most {n - 1} layer(s) ahead")
        sw = cfg.switches
        wanted = min(FAR_LAYER_AHEAD, max(1, n - 2)) if sw.queue_layer_ahead == "auto" else sw.queue_layer_ahead
        far = reachable_distance(n, wanted)
        if sw.queue_layer_ahead != "auto" and far != wanted:
            adjusted.append(f"queue run layer-ahead {wanted} -> {far}: a {n}-layer model predicts at most "
                            f"{n - 1} layer(s) ahead")
        batch = sw.batch
        # a micro-batch predicts up to min(experts, b * used) distinct experts; the queue must be smaller
        queue = (max(1, min(SMALL_QUEUE, min(facts.n_expert, batch * facts.n_expert_used) - 1))
                 if sw.queue == "auto" else sw.queue)
        pins = pin_batch(facts, batch)
        if pins is not None and pins != batch:
            adjusted.append(f"hot-pin run -b {batch} -> {pins}: the micro-batch's need would take every slot "
                            f"of the {facts.n_expert * n} experts, leaving none to pin")
        alt = cfg.determinism.threads_alt
        other = (sorted(set(SPLIT_THREADS) | {cpus}) if alt in ("auto", 0)     # 0: the old spelling of auto
                 else [alt] if isinstance(alt, int) else alt)
        threads = tuple(t for t in other if t != cfg.engine.threads)
        ms = cfg.model_suite
        positions = int(ms.context_fraction * facts.n_ctx_train)
        if ms.max_positions != "auto":       # auto is made concrete from the model first (config/derive.py)
            positions = min(positions, ms.max_positions)
        positions = max(2, positions)
        decode = (("layer, prefetch-stress, determinism", cfg.run.n_predict), ("switches", sw.n_predict),
                  ("e2e", cfg.e2e.n_predict), ("model", ms.n_predict), ("perf", cfg.perf.n_predict))
        farthest = reachable_distance(n, FAR_LAYER_AHEAD)
        # the switch runs' arenas have margin_experts slots' bytes above the minimum, but the
        # contract's split can give all of it to the large class: the small one then sits at
        # its need and the slot plan's proportional branch is never run; one run more where so
        margin = facts.margin_arena_bytes(batch, False, sw.margin_experts)
        class_margin = margin != facts.min_arena_bytes(batch, False, sw.margin_experts)
        # too shallow for a lookup to consume a prefetch before the predicted layer's start: a
        # second queue run with uniform slots (every layer's misses can evict a waiting
        # prefetch) in the minimum arena, so an eviction makes room and a prediction goes late
        by_eviction = far >= 1 and late_issue_reason(n, far) is not None
        return cls(jobs, memory_mb, stress, far, farthest, class_margin, by_eviction, queue, pins, threads,
                   positions, decode, tuple(adjusted))

    @property
    def farthest_run(self) -> bool:
        """Whether the check needs a run of its own at the farthest distance: no other run
        reaches it (a 3-layer model's queue run stays 1 ahead, so a prediction can be issued
        late, and its engine's 2-ahead branch would otherwise never run)."""
        return self.farthest_layer_ahead > max(self.far_layer_ahead, self.stress_layer_ahead, CONTRACT_LAYER_AHEAD)

    def unreachable(self, facts: ModelFacts, switch: str, value: str, distance: int) -> str | None:
        """Why a run setting `switch` to `value` (predicting `distance` layers ahead) cannot
        show that switch's branch event on this model; None: it must show it."""
        if switch in ("SDQ_PREFETCH_LAYER_AHEAD",) and not predicts(facts.n_layer, int(value)):
            return f"a {facts.n_layer}-layer model has no layer {value} ahead to predict"
        if switch == "SDQ_PREFETCH_QUEUE":
            return late_issue_reason(facts.n_layer, distance)
        if switch == "SDQ_PREFETCH_STALE_TOKENS":
            return stale_reason(facts, distance)
        if switch in ("SDQ_HOT_PIN", "SDQ_PROFILE_IN") and self.hot_pin_batch is None:
            return (f"{facts.n_expert} experts in one layer, all used by every token: the micro-batch needs "
                    f"every slot, so no expert can be pinned")
        return None

    def prefetch_reason(self, facts: ModelFacts, distance: int) -> str | None:
        """Why a run predicting `distance` layers ahead issues no prefetch (None: it must)."""
        return None if predicts(facts.n_layer, distance) else \
            f"a {facts.n_layer}-layer model has no layer {distance} ahead to predict"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["adjusted"] = list(self.adjusted)
        d["decode"] = dict(self.decode)
        return d

    def text(self) -> str:
        mem = "no memory limit" if self.memory_mb is None else f"{self.memory_mb:.0f} MiB for engine runs"
        pins = "no pin possible" if self.hot_pin_batch is None else f"hot pins at -b {self.hot_pin_batch}"
        queue = (f"queue run layer-ahead {self.far_layer_ahead}, queue {self.small_queue}" if self.far_layer_ahead
                 else "no queue run (no layer ahead to predict)")
        if self.queue_by_eviction:
            queue += " and one in uniform slots in the minimum arena (only evictions free the queue)"
        if self.farthest_run:
            queue += f", a run at layer-ahead {self.farthest_layer_ahead}"
        if self.class_margin_run:
            queue += ", a run with a margin in every slot class"
        out = (f"plan: {self.jobs} engine run(s) at once, {mem}; prefetch-stress layer-ahead "
               f"{self.stress_layer_ahead}; {queue}; {pins}; determinism also at -t "
               f"{', '.join(map(str, self.other_threads))}; model suite {self.model_positions} prompt positions; "
               f"decode steps: {', '.join(f'{k} {v}' for k, v in self.decode)}")
        return out + "".join(f"\n  adjusted: {a}" for a in self.adjusted)
