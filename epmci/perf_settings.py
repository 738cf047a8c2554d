"""Settings of the perf suite, `epmci golden` and `--perf-base` (the `perf:` section of
epmci.yaml). A leaf module: epmci/config.py embeds PerfConfig in CheckConfig and calls
validate_perf(); the defaults here are the single source of truth, like the rest of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import InputError

INCONCLUSIVE = ("skip", "pass", "fail")


@dataclass
class PerfConfig:
    profile: str = "local"           # golden/<profile>/<model id>.yaml (--profile)
    golden_dir: str = "golden"       # relative to the config file's directory (else the cwd)
    timing: bool = True              # false (or --no-timing): tok/s comparisons reported as skipped
    base: str | None = None          # --perf-base REF: ABAB against the engine of a git ref
    scenarios: list[str] = field(default_factory=lambda: ["baseline"])   # experiments of epmci.bench
    prompts: list[str] = field(default_factory=lambda: [
        "The capital of France is", "請用一句話介紹你自己。"])             # the first one is timed
    n_predict: int = 16
    batch: int = 8                   # -b
    ctx: int = 256                   # -c
    arena_fraction: float = 0.25     # of all expert bytes (a scenario may override it)
    ram_budget_mb: float = 1024.0    # --ram-budget-mb of every perf run; peak RSS must stay under it
    repeats: int = 5                 # timed runs per scenario (check and golden update)
    fast_repeats: int = 3            # with --fast
    max_repeats: int = 9             # an UNKNOWN verdict buys more runs, up to this many
    alpha: float = 0.05              # p-value below which a difference is significant
    min_effect: float = 0.05         # smallest tok/s change (relative) that counts
    inconclusive: str = "skip"       # status of a verdict still UNKNOWN at the cap: skip | pass | fail
    base_pairs: int = 8              # --perf-base: ABBA pairs before the first verdict
    base_max_pairs: int = 12         # UNKNOWN buys more pairs, up to this many
    base_n_predict: int = 64         # --perf-base runs: longer decode, steadier tok/s (docs/PERF.md)
    paired_test: str = "wilcoxon"    # --perf-base p-value: wilcoxon (signed-rank) | sign
    golden_rows: int = 8             # logits rows per prompt kept in the golden side file


def validate_perf(p: PerfConfig, where: str) -> None:
    import re
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", p.profile or ""):
        raise InputError(where, f"perf.profile must be letters, digits, '.', '_' or '-', got {p.profile!r}")
    if not p.golden_dir:
        raise InputError(where, "perf.golden_dir is empty")
    if p.base is not None and not str(p.base).strip():
        raise InputError(where, "perf.base (--perf-base) is empty")
    if not p.scenarios:
        raise InputError(where, "perf.scenarios: empty")
    from .bench import EXPERIMENTS
    bad = [s for s in p.scenarios if s not in EXPERIMENTS]
    if bad:
        raise InputError(where, f"perf.scenarios: unknown {bad} (experiments of `epmci bench`: "
                                f"{', '.join(EXPERIMENTS)})")
    if len(set(p.scenarios)) != len(p.scenarios):
        raise InputError(where, "perf.scenarios: duplicates")
    if not p.prompts or any(not x for x in p.prompts):
        raise InputError(where, "perf.prompts: needs at least one non-empty prompt")
    for key, val, lo in (("perf.n_predict", p.n_predict, 2), ("perf.batch", p.batch, 1),
                         ("perf.ctx", p.ctx, 16), ("perf.repeats", p.repeats, 3),
                         ("perf.fast_repeats", p.fast_repeats, 3), ("perf.max_repeats", p.max_repeats, 3),
                         ("perf.base_pairs", p.base_pairs, 2), ("perf.base_max_pairs", p.base_max_pairs, 2),
                         ("perf.golden_rows", p.golden_rows, 1), ("perf.base_n_predict", p.base_n_predict, 2)):
        if val < lo:
            raise InputError(where, f"{key} must be >= {lo}, got {val}")
    if p.max_repeats < max(p.repeats, p.fast_repeats):
        raise InputError(where, "perf.max_repeats must be >= perf.repeats and perf.fast_repeats")
    if p.base_max_pairs < p.base_pairs:
        raise InputError(where, "perf.base_max_pairs must be >= perf.base_pairs")
    from .stats import per_look_alpha, smallest_p
    look_alpha = per_look_alpha(p.alpha, p.base_pairs, p.base_max_pairs)
    if smallest_p(p.base_pairs) >= look_alpha:
        raise InputError(where, f"perf.base_pairs={p.base_pairs} can never give a verdict: its smallest p-value "
                                f"{smallest_p(p.base_pairs):.3g} is not below alpha per look {look_alpha:.3g}; "
                                f"use more pairs, fewer looks or a larger alpha")
    if not 0 < p.arena_fraction <= 1:
        raise InputError(where, f"perf.arena_fraction must be in (0, 1], got {p.arena_fraction}")
    if not p.ram_budget_mb > 0:
        raise InputError(where, f"perf.ram_budget_mb must be > 0, got {p.ram_budget_mb}")
    if not 0 < p.alpha < 1:
        raise InputError(where, f"perf.alpha must be in (0, 1), got {p.alpha}")
    if not 0 <= p.min_effect < 1:
        raise InputError(where, f"perf.min_effect must be in [0, 1), got {p.min_effect}")
    if p.paired_test not in ("wilcoxon", "sign"):
        raise InputError(where, f"perf.paired_test must be wilcoxon or sign, got {p.paired_test!r}")
    if p.inconclusive not in INCONCLUSIVE:
        raise InputError(where, f"perf.inconclusive must be one of {', '.join(INCONCLUSIVE)}, "
                                f"got {p.inconclusive!r}")
