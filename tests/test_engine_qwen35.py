"""The engine's qwen35moe forward against the NumPy reference, bit for bit: every layer's MoE
input, routed and shared expert outputs, every delta-net layer's state after every
micro-batch, and the logits; and its own invariants: paged == resident, any thread count,
any micro-batch size, one token at a time == a batch, KV cache only for attention layers."""

from __future__ import annotations

import numpy as np
import pytest

from engine.qwen35moe import Qwen35Model, state_bytes
from engine.runtime import Engine, Options
from epmci.gguf.file import ModelFile
from epmci.reference import reference_model
from epmci.synth.presets import PRESETS
from epmci.synth.writer import calibration_tokens


def engine(path, threads=1, batch=8, pager=False, n_ctx=128):
    return Engine(str(path), Options(n_ctx=n_ctx, threads=threads, batch=batch, pager=pager))


def traced_eval(eng, tokens):
    moe, states = [], []
    eng.on_moe(moe.append)
    eng.on_state(states.append)
    return eng.eval(tokens), moe, states


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).tobytes()


@pytest.mark.parametrize("preset,n_tokens,batch", [("tiny35", 24, 5), ("ci35", 24, 7)])
def test_layers_states_and_logits_match_reference_bitwise(preset, n_tokens, batch, request):
    """Paged, two threads, micro-batches that do not divide the prompt: every value the
    reference records is equal in every bit."""
    path = request.getfixturevalue(f"{preset}_model")
    tokens = calibration_tokens(PRESETS[preset], 0)[:n_tokens]
    eng = engine(path, threads=2, batch=batch, pager=True)
    try:
        logits, moe, states = traced_eval(eng, tokens)
    finally:
        eng.close()
    ends = sorted({s.pos0 + s.n_rows - 1 for s in states})
    assert ends == sorted({min(i + batch, n_tokens) - 1 for i in range(0, n_tokens, batch)})
    ref = reference_model(ModelFile(path)).forward(tokens, state_after=ends)
    hp = ModelFile(path).hp
    for il in range(hp.n_layer):
        mine = [t for t in moe if t.layer == il]
        cat = lambda name: np.concatenate([getattr(t, name) for t in mine])
        assert bits(cat("h")) == bits(ref.moe_in[il]), f"layer {il}: MoE input differs"
        assert np.array_equal(cat("selected"), ref.moe[il].selected), f"layer {il}: routing differs"
        assert bits(cat("out")) == bits(ref.moe[il].out), f"layer {il}: routed experts' output differs"
        assert bits(cat("shared")) == bits(ref.shared[il]), f"layer {il}: shared expert output differs"
    assert len(states) == sum(hp.is_recurrent(il) for il in range(hp.n_layer)) * len(ends)
    for s in states:
        r = ref.states[s.pos0 + s.n_rows - 1][s.layer]
        assert bits(s.conv) == bits(r.conv), f"layer {s.layer} after position {s.pos0 + s.n_rows - 1}: conv state"
        assert bits(s.ssm) == bits(r.ssm), f"layer {s.layer} after position {s.pos0 + s.n_rows - 1}: ssm state"
    assert bits(logits) == bits(ref.logits)


def test_threads_batches_paging_and_token_at_a_time_give_identical_bits(ci35_model):
    tokens = calibration_tokens(PRESETS["ci35"], 0)[:20]
    runs = {}
    for name, kw in {"resident -t1 -b20": dict(threads=1, batch=20),
                     "resident -t2 -b3": dict(threads=2, batch=3),
                     "paged -t2 -b7": dict(threads=2, batch=7, pager=True),
                     "paged -t1 -b1": dict(threads=1, batch=1, pager=True)}.items():
        eng = engine(ci35_model, **kw)
        try:
            runs[name] = bits(eng.eval(tokens))
        finally:
            eng.close()
    eng = engine(ci35_model, threads=2)
    try:   # prefill 12, then one token at a time through decode: state carried across phases
        runs["prefill 12 + decode 8"] = bits(np.concatenate(
            [eng.eval(tokens[:12])] + [eng.eval([t], "decode") for t in tokens[12:]]))
    finally:
        eng.close()
    first = next(iter(runs.values()))
    assert all(v == first for v in runs.values()), [k for k, v in runs.items() if v != first]


def test_kv_cache_only_for_attention_layers_and_state_counted_in_budget(tiny35_model):
    eng = engine(tiny35_model, n_ctx=64)
    try:
        m, hp = eng.model, eng.gm.hp
        assert isinstance(m, Qwen35Model)
        attention = [il for il in range(hp.n_layer) if not hp.is_recurrent(il)]
        assert attention == [3] and sorted(m.kv_slot) == attention
        assert m.k_cache.shape[0] == m.v_cache.shape[0] == 1
        assert sorted(m.conv_state) == sorted(m.ssm_state) == [0, 1, 2]
        held = (m.k_cache.nbytes + m.v_cache.nbytes + sum(a.nbytes for a in m.conv_state.values())
                + sum(a.nbytes for a in m.ssm_state.values()))
        assert state_bytes(hp, 64) == held
        # the shared expert is a resident dense weight, counted with the resident bytes
        assert all(not np.shares_memory(t.data, eng.gm.file.data)
                   for name, t in eng.gm.tensors.items() if "_shexp." in name)
        assert sum(t.data.nbytes for n, t in eng.gm.tensors.items() if "_shexp." in n) > 0
    finally:
        eng.close()
