"""Options several commands share: where the settings come from (--config, --set, --model,
--engine-cmd, ...) and the flags that map onto settings, turned into a CheckConfig."""

from __future__ import annotations

import argparse

from ..config import load_config, parse_set, set_path
from ..config.schema import SUITE_NAMES, CheckConfig
from ..check.workdirs import KEEP_FAILED
from ..errors import InputError


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="settings file (default: epmci.yaml in the cwd or a parent)")
    p.add_argument("--model", help="preset name (made on first use) or path to a qwen3moe or qwen35moe GGUF")
    p.add_argument("--engine-cmd", help="engine command line speaking docs/engine-contract.md "
                                        "(default: the bundled engine)")
    p.add_argument("--build-cmd", help="external engine: its build command")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any setting, e.g. --set layer.tolerance.atol=1e-6 (repeatable)")


def add_check_args(c: argparse.ArgumentParser) -> None:
    """The flags of `epmci check` that map onto settings."""
    c.add_argument("--fast", action="store_true", help="skip the end-to-end A/B suite")
    c.add_argument("--suites", help=f"comma-separated suites to run ({','.join(SUITE_NAMES)})")
    c.add_argument("--layers", help="comma-separated layers for the layer / prefetch-stress suites")
    c.add_argument("--jobs", type=int, help="engine runs at once (0 = one per CPU)")
    c.add_argument("--threads", type=int, help="engine compute threads (-t)")
    c.add_argument("--timeout", type=float, help="seconds before an engine run is killed")
    c.add_argument("--arena-mb", type=float, help="arena of the ordinary paged runs")


def non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def add_output_args(c: argparse.ArgumentParser) -> None:
    """Where a check's reports and engine outputs go (`epmci check`, `epmci contract-test`)."""
    c.add_argument("--junit-xml", metavar="PATH", help="write JUnit XML")
    c.add_argument("--json", metavar="PATH", help="write the report as JSON")
    c.add_argument("--no-build", action="store_true", help="do not build the engine first")
    c.add_argument("--workdir", help="where engine outputs go (default: a temp dir)")
    c.add_argument("--keep-work", action="store_true", help="keep engine outputs even when all passed")
    c.add_argument("--keep-failed", type=non_negative_int, default=KEEP_FAILED, metavar="N",
                   help=f"a failed check keeps its engine outputs; of the failed checks' outputs in the same "
                        f"place, only the newest N stay (default {KEEP_FAILED})")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def add_perf_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("--profile", help="runner profile of the golden baselines (golden/<profile>/; "
                                     "default: perf.profile of epmci.yaml)")
    c.add_argument("--no-timing", action="store_true",
                   help="skip every tok/s comparison (counters, fingerprints and RSS are still compared)")
    c.add_argument("--no-perf", action="store_true", help="do not run the perf suite")
    c.add_argument("--allow-missing-baseline", action="store_true",
                   help="no golden baseline for the profile and model is a skip, also in CI (perf.missing_baseline)")
    c.add_argument("--perf-base", metavar="REF",
                   help="also measure the engine of git REF against this one in the same run: both alive, their "
                        "decode steps interleaved in process pairs (whole-run ABBA pairs when an engine cannot be "
                        "paced); SAME means at most perf.base_min_effect slower (docs/perf-gate.md)")


def config_from_args(a: argparse.Namespace) -> CheckConfig:
    """epmci.yaml (or --config) <- --set KEY=VALUE <- the dedicated flags."""
    over = parse_set(a.set)
    flags = {
        "model": a.model, "engine.cmd": a.engine_cmd, "engine.build_cmd": a.build_cmd,
        "engine.timeout_s": getattr(a, "timeout", None), "engine.threads": getattr(a, "threads", None),
        "run.jobs": getattr(a, "jobs", None), "run.arena_mb": getattr(a, "arena_mb", None),
        "perf.profile": getattr(a, "profile", None) or None, "perf.base": getattr(a, "perf_base", None) or None,
    }
    if getattr(a, "fast", False):
        flags["fast"] = True
    if getattr(a, "no_timing", False):
        flags["perf.timing"] = False
    if getattr(a, "allow_missing_baseline", False):
        flags["perf.missing_baseline"] = "skip"
    if getattr(a, "suites", None):
        flags["suites"] = [x.strip() for x in a.suites.split(",") if x.strip()]
    if getattr(a, "layers", None):
        try:
            flags["layer.layers"] = [int(x) for x in a.layers.split(",") if x.strip()]
        except ValueError:
            raise InputError("--layers", f"expected comma-separated layer numbers, got {a.layers!r}") from None
    for k, v in flags.items():
        if v is not None:
            set_path(over, k, v)
    cfg = load_config(a.config, over)
    if getattr(a, "no_perf", False):
        cfg.suites = [s for s in cfg.suites if s != "perf"]
        if not cfg.suites:
            raise InputError("--no-perf", "no suite left to run")
    if cfg.perf.base and "perf" not in cfg.suites:
        raise InputError("--perf-base", "needs the perf suite (it is not in the suites run)")
    return cfg
