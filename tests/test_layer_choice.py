"""Which layers the layer suite checks (suites/layer.auto_layers), on the production layout."""

from __future__ import annotations

from epmci.check.suites.layer import auto_layers
from epmci.gguf.facts import ModelFacts

SMALL, LARGE = 1_900_544, 2_039_808


def facts(kinds: list[str], sizes: list[int]) -> ModelFacts:
    n = len(kinds)
    return ModelFacts(n, 256, 8, 2048, [("Q4_K", "Q4_K", "Q5_K" if s == SMALL else "Q6_K") for s in sizes],
                      sizes, sizes, kinds)


def test_production_layout_covers_both_kinds_both_sizes_and_both_ends():
    kinds = ["attention" if (il + 1) % 4 == 0 else "deltanet" for il in range(40)]
    sizes = [LARGE if il in (34, 38, 39) else SMALL for il in range(40)]
    layers = auto_layers(facts(kinds, sizes))
    assert {0, 39} <= set(layers)
    assert {kinds[il] for il in layers} == {"attention", "deltanet"}
    assert {sizes[il] for il in layers} == {SMALL, LARGE}
    assert {33, 34, 35, 37, 38} <= set(layers)          # each edge between the slot classes
    assert len(layers) <= 10                            # a handful of the 40, not all


def test_a_kind_the_other_rules_miss_is_added():
    kinds = ["deltanet"] * 8
    kinds[5] = "attention"
    layers = auto_layers(facts(kinds, [SMALL] * 8))
    assert layers == [0, 4, 5, 7]
