"""Validation of a loaded configuration: every bad value is an InputError naming the file
(exit 2 before any engine runs)."""

from __future__ import annotations

import re

from ..compare.stats import per_look_alpha, smallest_p
from ..contract.capabilities import FEATURES
from ..errors import InputError
from .experiments import EXPERIMENTS
from .schema import BASE_MODES, COMPARE_MODES, INCONCLUSIVE, LAYOUTS, SUITE_NAMES, CheckConfig, PerfConfig


def validate(cfg: CheckConfig) -> None:
    w = cfg.source
    bad = [s for s in cfg.suites if s not in SUITE_NAMES]
    if bad:
        raise InputError(w, f"suites: unknown {bad} (choose from {', '.join(SUITE_NAMES)})")
    if not cfg.suites:
        raise InputError(w, "suites: empty")
    e, r = cfg.engine, cfg.run
    for key, val, lo in (("engine.threads", e.threads, 1), ("engine.ctx", e.ctx, 16),
                         ("run.jobs", r.jobs, 0), ("run.batch", r.batch, 1),
                         ("run.n_predict", r.n_predict, 1), ("run.slot_align", r.slot_align, 1),
                         ("run.margin_experts", r.margin_experts, 0),
                         ("kernel.rows", cfg.kernel.rows, 1),
                         ("prefetch_stress.batch", cfg.prefetch_stress.batch, 1),
                         ("prefetch_stress.queue", cfg.prefetch_stress.queue, 1),
                         ("prefetch_stress.stale_tokens", cfg.prefetch_stress.stale_tokens, 0),
                         ("prefetch_stress.margin_experts", cfg.prefetch_stress.margin_experts, 0),
                         ("e2e.n_predict", cfg.e2e.n_predict, 1)):
        if val < lo:
            raise InputError(w, f"{key} must be >= {lo}, got {val}")
    for name in ("max_output_mb", "max_disk_mb"):
        v = getattr(e, name)
        if isinstance(v, (str, bool)) or not v > 0:
            raise InputError(w, f"engine.{name} must be a number of MiB > 0, got {v!r}")
    for key, t in (("engine.timeout_s", e.timeout_s), ("engine.build_timeout_s", e.build_timeout_s)):
        if t == "auto" and key == "engine.timeout_s":
            continue
        if isinstance(t, str) or not t > 0:
            raise InputError(w, f"{key} must be a number of seconds > 0{' or auto' if key == 'engine.timeout_s' else ''}, "
                                f"got {t!r}")
    if isinstance(r.memory_mb, str) and r.memory_mb != "auto" or not isinstance(r.memory_mb, str) and r.memory_mb <= 0:
        raise InputError(w, f"run.memory_mb must be a number of MiB > 0 or 'auto', got {r.memory_mb!r}")
    if isinstance(r.arena_mb, str) and r.arena_mb != "auto":
        raise InputError(w, f"run.arena_mb must be a number of MiB or 'auto', got {r.arena_mb!r}")
    if not isinstance(r.arena_mb, str) and r.arena_mb <= 0:
        raise InputError(w, f"run.arena_mb must be > 0, got {r.arena_mb}")
    if not 0 < r.arena_fraction <= 1:
        raise InputError(w, f"run.arena_fraction must be in (0, 1], got {r.arena_fraction}")
    if isinstance(cfg.kernel.pairs, str):
        if cfg.kernel.pairs != "auto":
            raise InputError(w, f"kernel.pairs must be 'auto' or [[layer, expert], ...], got {cfg.kernel.pairs!r}")
    elif not cfg.kernel.pairs or any(len(p) != 2 for p in cfg.kernel.pairs):
        raise InputError(w, "kernel.pairs must be 'auto' or a non-empty list of [layer, expert]")
    kp = cfg.kernel.paths
    if kp != "auto" and (isinstance(kp, str) or not all(isinstance(x, str) and x for x in kp)):
        raise InputError(w, f"kernel.paths must be 'auto' or a list of kernel path names, got {kp!r}")
    if isinstance(cfg.layer.layers, str):
        if cfg.layer.layers != "auto":
            raise InputError(w, f"layer.layers must be 'auto' or a list of layers, got {cfg.layer.layers!r}")
    elif not cfg.layer.layers:
        raise InputError(w, "layer.layers must be 'auto' or a non-empty list")
    alt = cfg.determinism.threads_alt
    counts = [alt] if isinstance(alt, int) else alt
    if alt not in ("auto", 0) and (isinstance(alt, str) or not counts or
                          any(isinstance(t, bool) or not isinstance(t, int) or t < 1 or t == e.threads for t in counts)):
        raise InputError(w, f"determinism.threads_alt must be 'auto' (or 0) or thread counts >= 1 other than engine.threads "
                            f"({e.threads}), got {alt!r}")
    bad = [x for x in cfg.prefetch_stress.layouts if x not in LAYOUTS]
    if bad or not cfg.prefetch_stress.layouts:
        raise InputError(w, f"prefetch_stress.layouts must be a non-empty subset of {list(LAYOUTS)}")
    if cfg.e2e.compare not in COMPARE_MODES:
        raise InputError(w, f"e2e.compare must be one of {', '.join(COMPARE_MODES)}, got {cfg.e2e.compare!r}")
    ms = cfg.model_suite
    if ms.max_positions != "auto" and (isinstance(ms.max_positions, str) or ms.max_positions < 2):
        raise InputError(w, f"model_suite.max_positions must be 'auto' or >= 2, got {ms.max_positions!r}")
    if not 0 < ms.context_fraction <= 0.95:
        raise InputError(w, f"model_suite.context_fraction must be in (0, 0.95], got {ms.context_fraction}")
    if ms.n_predict < 2 or ms.batch < 1:
        raise InputError(w, "model_suite.n_predict must be >= 2 (decode steps to check) and model_suite.batch >= 1")
    if ms.compare not in COMPARE_MODES or not ms.max_kl >= 0:
        raise InputError(w, f"model_suite.compare must be one of {', '.join(COMPARE_MODES)} and max_kl >= 0")
    sw = cfg.switches
    if sw.batch < 1 or sw.n_predict < 2 or sw.margin_experts < 0 or sw.hot_pin < 1:
        raise InputError(w, "switches: batch >= 1, n_predict >= 2, margin_experts >= 0 and hot_pin >= 1 needed")
    for key, val, lo in (("switches.queue_layer_ahead", sw.queue_layer_ahead, 1), ("switches.queue", sw.queue, 1)):
        if val != "auto" and (isinstance(val, (str, bool)) or not isinstance(val, int) or val < lo):
            raise InputError(w, f"{key} must be 'auto' or a whole number >= {lo}, got {val!r}")
    if not cfg.e2e.max_kl >= 0:
        raise InputError(w, f"e2e.max_kl must be >= 0, got {cfg.e2e.max_kl}")
    if cfg.contract.n_predict < 2 or not cfg.contract.text:
        raise InputError(w, "contract: n_predict must be >= 2 (a decode step to check) and text non-empty")
    validate_perf(cfg.perf, w)
    for key, tol in (("kernel.tolerance", cfg.kernel.tolerance), ("layer.tolerance", cfg.layer.tolerance)):
        if not (tol.atol >= 0 and tol.rtol >= 0):
            raise InputError(w, f"{key}: atol and rtol must be >= 0")
    prompts = [cfg.prompts.layer, cfg.prompts.stress, cfg.prompts.determinism, cfg.prompts.model, cfg.prompts.switches, *cfg.prompts.e2e]
    if not cfg.prompts.e2e or any(not p for p in prompts):
        raise InputError(w, "prompts: every prompt must be non-empty, and e2e needs at least one")
    bad = [f for f in e.features or () if f not in FEATURES]
    if bad:
        raise InputError(w, f"engine.features: unknown {bad} (features of the contract: {', '.join(FEATURES)})")
    for key, cmd in (("engine.cmd", e.cmd), ("engine.build_cmd", e.build_cmd)):
        if cmd is not None and not (cmd if isinstance(cmd, list) else str(cmd).strip()):
            raise InputError(w, f"{key} is empty")


def validate_perf(p: PerfConfig, where: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", p.profile or ""):
        raise InputError(where, f"perf.profile must be letters, digits, '.', '_' or '-', got {p.profile!r}")
    if not p.golden_dir:
        raise InputError(where, "perf.golden_dir is empty")
    if p.base is not None and not str(p.base).strip():
        raise InputError(where, "perf.base (--perf-base) is empty")
    if not p.scenarios:
        raise InputError(where, "perf.scenarios: empty")
    bad = [s for s in p.scenarios if s not in EXPERIMENTS]
    if bad:
        raise InputError(where, f"perf.scenarios: unknown {bad} (experiments of `epmci bench`: "
                                f"{', '.join(EXPERIMENTS)})")
    if len(set(p.scenarios)) != len(p.scenarios):
        raise InputError(where, "perf.scenarios: duplicates")
    if not p.prompts or any(not x for x in p.prompts):
        raise InputError(where, "perf.prompts: needs at least one non-empty prompt")
    for key, val, lo in (("perf.n_predict", p.n_predict, 2), ("perf.batch", p.batch, 1),
                         ("perf.ctx", p.ctx, 16), ("perf.repeats", p.repeats, 3), ("perf.max_repeats", p.max_repeats, 3),
                         ("perf.base_pairs", p.base_pairs, 3), ("perf.base_max_pairs", p.base_max_pairs, 3),
                         ("perf.base_more_pairs", p.base_more_pairs, 1),
                         ("perf.base_steps", p.base_steps, 4), ("perf.base_warmup_steps", p.base_warmup_steps, 0),
                         ("perf.abba_pairs", p.abba_pairs, 2), ("perf.abba_max_pairs", p.abba_max_pairs, 2),
                         ("perf.golden_rows", p.golden_rows, 1), ("perf.abba_n_predict", p.abba_n_predict, 2)):
        if val == "auto" and key == "perf.golden_rows":
            continue
        if isinstance(val, str) or val < lo:
            raise InputError(where, f"{key} must be >= {lo}, got {val}")
    if p.max_repeats < p.repeats:
        raise InputError(where, "perf.max_repeats must be >= perf.repeats")
    for kind in ("base", "abba"):
        if getattr(p, f"{kind}_max_pairs") < getattr(p, f"{kind}_pairs"):
            raise InputError(where, f"perf.{kind}_max_pairs must be >= perf.{kind}_pairs")
    look_alpha = per_look_alpha(p.alpha, p.abba_pairs, p.abba_max_pairs)
    if smallest_p(p.abba_pairs) >= look_alpha:
        raise InputError(where, f"perf.abba_pairs={p.abba_pairs} can never give a verdict: its smallest p-value "
                                f"{smallest_p(p.abba_pairs):.3g} is not below alpha per look {look_alpha:.3g}; "
                                f"use more pairs, fewer looks or a larger alpha")
    n_paced = p.base_warmup_steps + p.base_steps + 1
    if n_paced >= p.ctx:
        raise InputError(where, f"perf.base_warmup_steps + perf.base_steps + 1 = {n_paced} tokens do not fit "
                                f"perf.ctx {p.ctx} with a prompt")
    if p.base_mode not in BASE_MODES:
        raise InputError(where, f"perf.base_mode must be one of {', '.join(BASE_MODES)}, got {p.base_mode!r}")
    if not 0 < p.base_alpha < 0.5:
        raise InputError(where, f"perf.base_alpha must be in (0, 0.5), got {p.base_alpha}")
    if not 0 < p.base_min_effect < 1:
        raise InputError(where, f"perf.base_min_effect must be in (0, 1), got {p.base_min_effect}")
    if not 0 <= p.base_floor <= p.base_min_effect:
        raise InputError(where, f"perf.base_floor must be in [0, perf.base_min_effect = {p.base_min_effect}], "
                                f"got {p.base_floor}")
    if not p.p99_max_ratio > 1:
        raise InputError(where, f"perf.p99_max_ratio must be > 1, got {p.p99_max_ratio}")
    if not 0 < p.arena_fraction <= 1:
        raise InputError(where, f"perf.arena_fraction must be in (0, 1], got {p.arena_fraction}")
    if p.ram_budget_mb != "auto" and (isinstance(p.ram_budget_mb, str) or not p.ram_budget_mb > 0):
        raise InputError(where, f"perf.ram_budget_mb must be > 0, got {p.ram_budget_mb}")
    if not 0 < p.alpha < 1:
        raise InputError(where, f"perf.alpha must be in (0, 1), got {p.alpha}")
    if not 0 <= p.min_effect < 1:
        raise InputError(where, f"perf.min_effect must be in [0, 1), got {p.min_effect}")
    if p.paired_test not in ("wilcoxon", "sign"):
        raise InputError(where, f"perf.paired_test must be wilcoxon or sign, got {p.paired_test!r}")
    if p.missing_baseline not in ("auto", "fail", "skip"):
        raise InputError(where, f"perf.missing_baseline must be auto, fail or skip, got {p.missing_baseline!r}")
    if not (p.rss_growth_pct >= 0 and p.rss_growth_mb >= 0):
        raise InputError(where, "perf.rss_growth_pct and perf.rss_growth_mb must be >= 0")
    if not 0 < p.drift_max < 1:
        raise InputError(where, f"perf.drift_max must be in (0, 1), got {p.drift_max}")
    if isinstance(p.drift_recent, bool) or not isinstance(p.drift_recent, int) or p.drift_recent < 1:
        raise InputError(where, f"perf.drift_recent must be an integer >= 1, got {p.drift_recent!r}")
    if not 0 < p.drift_pvalue < 0.5:
        raise InputError(where, f"perf.drift_pvalue must be in (0, 0.5), got {p.drift_pvalue}")
    if p.inconclusive not in INCONCLUSIVE:
        raise InputError(where, f"perf.inconclusive must be one of {', '.join(INCONCLUSIVE)}, "
                                f"got {p.inconclusive!r}")
