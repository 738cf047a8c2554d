"""The `auto` settings (epmci/config/derive.py): the same numbers as the old fixed defaults on
the small models, and what the production model needed by hand (four --set flags) on the
production shape, from its facts and an 8 GiB machine; a value the user sets wins."""

from __future__ import annotations

import dataclasses

from epmci.config import load_config
from epmci.config.derive import resolve
from epmci.config.schema import CheckConfig
from epmci.gguf.facts import ModelFacts
from epmci.gguf.file import ModelFile

GiB = 2**30


def prod35_full_facts() -> ModelFacts:
    """The production shape's facts (synth preset prod35-full, not made here: 21.5 GB):
    40 layers of 256 experts, top-8, Q6_K down on 3 layers, a 248,320-token vocabulary."""
    small, large = 1_900_544, 2_039_808
    eb = [large if il in (34, 38, 39) else small for il in range(40)]
    experts = sum(eb) * 256
    return ModelFacts(40, 256, 8, 2048, [("Q4_K", "Q4_K", "Q5_K")] * 40, eb, eb, ["attention"] * 40,
                      file_bytes=experts + 1_972_625_344, n_vocab=248_320)


def test_small_models_keep_the_old_defaults(tiny_model):
    cfg, derived = resolve(CheckConfig(), ModelFacts.of(ModelFile(tiny_model), 4096), 24_000.0)
    assert (cfg.engine.timeout_s, cfg.perf.ram_budget_mb, cfg.perf.golden_rows) == (300, 1024.0, 8)
    assert cfg.model_suite.max_positions > 10_000          # the context fraction decides, not the cap
    assert len(derived) == 4 and all(" " in line for line in derived)


def test_the_production_shape_in_8_gib_gets_what_it_needed_by_hand():
    """engine.timeout_s=900, perf.golden_rows=1 and 128 prompt positions (context_fraction
    0.03125 of 4096) were the hand-set overrides; the budget (4900 by hand) now leaves the
    check's memory pool its reserve."""
    cfg, derived = resolve(CheckConfig(), prod35_full_facts(), 8192.0)
    assert cfg.engine.timeout_s >= 900
    assert cfg.perf.ram_budget_mb == 4500.0                 # 55 % of 8 GiB, in 100 MiB steps
    assert cfg.perf.golden_rows == 1
    assert cfg.model_suite.max_positions == 128             # 4 micro-batches of 32
    assert any("capped at 0.55 of the machine's 8,192 MiB" in line for line in derived), derived
    # without a memory limit the budget is the run's whole need
    roomy, lines = resolve(CheckConfig(), prod35_full_facts(), None)
    assert roomy.perf.ram_budget_mb == 8500.0              # the need (8,402 MiB) rounded up, never down
    assert any("need at a 0.25 arena, 8,402 MiB" in line for line in lines), lines


def test_a_value_the_user_sets_wins(tmp_path):
    (tmp_path / "epmci.yaml").write_text("engine:\n  timeout_s: 42\nperf:\n  ram_budget_mb: 2000\n  golden_rows: 3\n"
                                         "model_suite:\n  max_positions: 64\n")
    user = load_config(str(tmp_path / "epmci.yaml"))
    cfg, derived = resolve(user, prod35_full_facts(), 8192.0)
    assert (cfg.engine.timeout_s, cfg.perf.ram_budget_mb, cfg.perf.golden_rows, cfg.model_suite.max_positions) == \
        (42, 2000, 3, 64) and derived == []
    assert dataclasses.asdict(user)["perf"]["ram_budget_mb"] == 2000      # the input is not changed
