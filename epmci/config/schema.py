"""The settings of `epmci check`, `epmci build`, `epmci golden` and `epmci bench` as typed
dataclasses. Their defaults are the single source of truth; the repo's epmci.yaml spells
them out (a test keeps the two equal)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..compare.arrays import Tolerance
from ..compare.logits import MODES
from ..contract.process import MAX_DISK_MB, MAX_OUTPUT_MB

CONFIG_NAME = "epmci.yaml"
SUITE_NAMES = ("contract", "kernel", "layer", "prefetch-stress", "determinism", "e2e", "model", "switches", "budget",
               "perf")
# what `epmci check` runs by default: the conformance suite is for engine authors (`epmci contract-test`)
DEFAULT_SUITES = SUITE_NAMES[1:]
COMPARE_MODES = MODES
LAYOUTS = ("mixed", "uniform")
INCONCLUSIVE = ("skip", "pass", "fail")
BASE_MODES = ("paced", "abba")


@dataclass
class EngineConfig:
    cmd: str | list[str] | None = None   # None: the bundled engine, `python -m engine`
    build_cmd: str | list[str] | None = None  # external engine: its build command
    build_timeout_s: float = 900.0
    timeout_s: float | str = "auto"      # every engine run is killed after this; auto: 300 s + the model file read at 32 MiB/s (config/derive.py)
    threads: int = 1                     # -t (determinism also runs another count)
    ctx: int = 512                       # -c
    env: dict[str, str] = field(default_factory=dict)
    features: list[str] | None = None    # None: as the engine's --contract-info declares; a list overrides it
    max_output_mb: float = MAX_OUTPUT_MB  # stdout + stderr one engine run may write; past it the run is killed and fails
    max_disk_mb: float = MAX_DISK_MB      # disk one engine run may take in its output directory; past it killed, fails


@dataclass
class RunConfig:
    jobs: int = 0                        # engine runs at once; 0 = one per CPU
    memory_mb: float | str = "auto"      # what engine runs at once may hold (contract/memory.py); auto: what is available at the start less epmci's own share (check/context.py)
    batch: int = 8                       # -b of the layer, determinism and e2e runs
    n_predict: int = 4                   # -n of the layer, stress and determinism runs
    arena_mb: float | str = "auto"       # auto: max(arena_fraction of expert bytes, minimum + margin_experts)
    arena_fraction: float = 0.25
    margin_experts: int = 2              # auto: slots above the minimum per class
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
    switches: str = "Write one sentence about SSD caching, then explain why experts are paged."
    # the model suite repeats this text until the prompt is long enough (model_suite.context_fraction);
    # digits, contractions, punctuation before letters, CJK, a combining accent and blank lines, so
    # the engine's tokenizer is compared with the reference's on what pre-tokenizers split differently
    model: str = ("Experts are read from the disk into a fixed arena of 64 slots (2.5 MiB each). The "
                  "router picks 8 of 256 experts for every token -- it's fast -- and the pager keeps "
                  "the hot ones in memory: 請用一句話介紹你自己。 Cafe\u0301 costs 1,900,544 B!\n\n")


@dataclass
class ContractConfig:
    # the conformance suite's generation: special tokens, several scripts, digits, a tab
    text: str = "Hello, world! 東京は日本の首都です。 x = 42 <|im_start|>user<|im_end|>\tdone"
    n_predict: int = 4               # -n of its generation (G = 4 unless an end token comes first)
    items: list[str] = field(default_factory=list)   # items to probe (epmci/check/suites/contract.py); [] = all


@dataclass
class KernelConfig:
    pairs: str | list[list[int]] = "auto"  # auto, or [[layer, expert], ...]
    paths: str | list[str] = "auto"   # kernel paths run besides the default: auto (every one the engine declares), or a list
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
    threads_alt: str | int | list[int] = "auto"   # the other -t counts; auto: the plan's (check/plan.py)


@dataclass
class E2EConfig:
    n_predict: int = 8
    compare: str = "kl"              # exact | argmax | kl: paged vs --no-pager (an engine declaring reference_exact: exact)
    max_kl: float = 1e-4             # with kl, max KL(no-pager || paged) per position, nats


@dataclass
class ModelSuiteConfig:
    context_fraction: float = 0.5    # prompt positions: at least this share of the model's context length
    n_predict: int = 8               # decode steps after the prompt (the reference teacher-forces them)
    batch: int = 32                  # -b of the run: the prompt crosses many micro-batches
    compare: str = "kl"              # exact | argmax | kl: the engine vs the reference (reference_exact: exact)
    # with kl, max KL(reference || engine) per position, nats: 4x llama.cpp's worst on the
    # shipped models (2.5e-3, ci; docs/CORRECTNESS.md "Tolerance for engines that are not bit-exact")
    max_kl: float = 1e-2
    max_positions: int | str = "auto"   # prompt positions at most; auto: the reference's work on this model (config/derive.py)


@dataclass
class SwitchesConfig:
    batch: int = 4                   # -b of the runs that do not set their own
    n_predict: int = 6
    margin_experts: int = 2          # slots above the minimum arena, per slot class: evictions every token
    hot_pin: int = 8                 # SDQ_HOT_PIN of the hot-pin run
    queue_layer_ahead: int | str = "auto"   # SDQ_PREFETCH_LAYER_AHEAD of the queue run; auto: the plan's (check/plan.py)
    queue: int | str = "auto"        # SDQ_PREFETCH_QUEUE of the queue run; auto: smaller than a micro-batch predicts (check/plan.py)
    runs: list[str] = field(default_factory=list)   # names of the runs to do (epmci/check/suites/switches.py); [] = all


@dataclass
class PerfConfig:
    profile: str = "local"           # golden/<profile>/<model id>.yaml (--profile)
    golden_dir: str = "golden"       # relative to the config file's directory (else the cwd)
    timing: bool = True              # false (or --no-timing): tok/s comparisons reported as skipped
    base: str | None = None          # --perf-base REF: ABAB against the engine of a git ref
    scenarios: list[str] = field(default_factory=lambda: ["baseline"])   # experiments of epmci/config/experiments.py
    prompts: list[str] = field(default_factory=lambda: [
        "The capital of France is", "請用一句話介紹你自己。"])             # the first one is timed
    n_predict: int = 16
    batch: int = 8                   # -b
    ctx: int = 256                   # -c
    arena_fraction: float = 0.25     # of all expert bytes (a scenario may override it)
    ram_budget_mb: float | str = "auto"  # --ram-budget-mb of every perf run; peak RSS must stay under it; auto: config/derive.py
    repeats: int = 5                 # timed runs per scenario (check and golden update; --fast: none)
    max_repeats: int = 9             # an UNKNOWN verdict buys more runs, up to this many
    alpha: float = 0.05              # golden and ABBA timing: false-alarm budget of a verdict (two-sided)
    min_effect: float = 0.05         # smallest tok/s change (relative) that counts
    inconclusive: str = "skip"       # status of a verdict still UNKNOWN at the cap: skip | pass | fail
    base_mode: str = "paced"         # --perf-base: paced (per-step interleaved; ABBA when it cannot) | abba
    base_pairs: int = 6              # paced: process pairs before the first verdict
    base_more_pairs: int = 6         # paced: UNKNOWN buys this many more pairs at a time...
    base_max_pairs: int = 24         # ...up to this many
    base_steps: int = 96             # paced: measured decode steps per process
    base_warmup_steps: int = 4       # paced: interleaved decode steps before the measured ones
    base_alpha: float = 0.01         # paced: false-alarm budget of a decision (one-sided), split over its looks
    base_floor: float = 0.0125       # paced: DIFFERENT needs the whole interval this far from no change
    base_min_effect: float = 0.03    # paced: SAME says the head is at most this much slower (docs/perf-gate.md)
    p99_max_ratio: float = 1.5       # paced: fail when the head's p99 inter-token latency is this many times the base's
    abba_pairs: int = 8              # ABBA: pairs before the first verdict
    abba_max_pairs: int = 12         # ABBA: UNKNOWN buys two more pairs at a time, up to this many
    abba_n_predict: int = 64         # ABBA runs: longer decode, steadier tok/s (docs/perf-gate.md)
    paired_test: str = "wilcoxon"    # ABBA p-value: wilcoxon (signed-rank) | sign
    golden_rows: int | str = "auto"  # logits rows per prompt kept in the golden side file; auto: 8, fewer for a large vocabulary
    missing_baseline: str = "auto"   # no golden for the profile and model: auto (fail in CI, else skip) | fail | skip
    rss_growth_pct: float = 10.0     # peak RSS may exceed golden's by the larger of this share ...
    rss_growth_mb: float = 16.0      # ... and this many MiB
    drift_max: float = 0.03          # epmci history: worse than this since the last rebaseline fails (perf/history.py)
    drift_recent: int = 3            # epmci history: newest entries whose median is "now"
    drift_pvalue: float = 0.01       # epmci history: E-Divisive's permutation test


@dataclass
class CheckConfig:
    model: str = "ci"                # preset name (made on first use) or a GGUF path
    suites: list[str] = field(default_factory=lambda: list(DEFAULT_SUITES))
    fast: bool = False               # skip e2e
    engine: EngineConfig = field(default_factory=EngineConfig)
    run: RunConfig = field(default_factory=RunConfig)
    prompts: PromptConfig = field(default_factory=PromptConfig)
    contract: ContractConfig = field(default_factory=ContractConfig)
    kernel: KernelConfig = field(default_factory=KernelConfig)
    layer: LayerConfig = field(default_factory=LayerConfig)
    prefetch_stress: StressConfig = field(default_factory=StressConfig)
    determinism: DeterminismConfig = field(default_factory=DeterminismConfig)
    e2e: E2EConfig = field(default_factory=E2EConfig)
    model_suite: ModelSuiteConfig = field(default_factory=ModelSuiteConfig)
    switches: SwitchesConfig = field(default_factory=SwitchesConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    source: str = field(default="<defaults>", metadata={"internal": True})

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d
