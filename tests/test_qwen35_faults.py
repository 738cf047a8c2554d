"""The gate on a qwen35moe model catches the faults this architecture invites, each with a
message that points at it: recurrent state not carried across micro-batches, the conv
window off by a token, the state reset between prefill and decode, the shared expert's gate
dropped, an attention layer's output gate dropped, a routed-expert paging fault on a
delta-net layer. Each fault is a broken copy of the bundled engine (tests/faults.py),
checked on tiny35: 3 delta-net layers (0-2) and one attention layer (3), a shared expert;
the model suite's prompt is at least 128 tokens in micro-batches of 32, then 8 decode
steps."""

from __future__ import annotations

import pytest

from faults import FAULT_SET, broken_engine, results, run_check, statuses

pytestmark = pytest.mark.usefixtures("built_engine")


def messages(rep: dict, suite: str) -> dict[str, str]:
    return {r["name"]: r["message"] for r in results(rep, suite)}


def check_broken(tmp_path, model, patch: str, *suites: str) -> dict:
    rc, rep = run_check(tmp_path, model, broken_engine(tmp_path, patch), "--suites", ",".join(suites))
    assert rc == 1, rep
    return rep


def test_the_bundled_engine_passes_the_model_suite_with_its_states(tmp_path, tiny35_model):
    rc, rep = run_check(tmp_path, tiny35_model, None, "--suites", "model,layer", "--no-build")
    assert rc == 0, rep
    assert statuses(rep, "model") == {"prompt positions": "pass", "decode positions": "pass",
                                      "delta-net state": "pass"}
    state = results(rep, "model")[2]
    p = state["properties"]
    assert p["state_layers"] == 3
    # one record per prompt micro-batch of 32, then one per decode step fed back (7 of 8)
    assert p["state_records"] == -(-p["prompt_tokens"] // 32) + 7, p
    assert "bit-identical" in state["message"]
    assert all("shared expert max_abs_err 0" in m for m in messages(rep, "layer").values())


def test_an_engine_without_the_state_dump_gets_the_state_result_skipped(tmp_path, tiny35_model):
    """Declared features without state_dump: the logits are still compared, the state result
    is a SKIP saying why, never dropped."""
    rc, rep = run_check(tmp_path, tiny35_model, None, "--suites", "model", "--no-build",
                        "--set", "engine.features=[pager,moe_dump]")
    assert rc == 0, rep
    assert statuses(rep, "model") == {"prompt positions": "pass", "decode positions": "pass",
                                      "delta-net state": "skip"}
    assert messages(rep, "model")["delta-net state"].startswith("engine lacks state_dump")


def test_recurrent_state_not_carried_across_micro_batches(tmp_path, tiny35_model):
    rep = check_broken(tmp_path, tiny35_model, FAULT_SET["recurrent state not carried across micro-batches"].patch, "model")
    st, msg = statuses(rep, "model"), messages(rep, "model")
    assert set(st.values()) == {"fail"}, st
    assert "first at position 32;" in msg["prompt positions"]          # the second micro-batch
    m = msg["delta-net state"]
    assert "first after position 63 (prompt micro-batch 2, rows 32..63) in layer 0" in m, m
    assert "conv window equal" in m and "recurrent (ssm) state differs" in m, m


def test_conv_state_shifted_by_one_token(tmp_path, tiny35_model):
    rep = check_broken(tmp_path, tiny35_model, """
        import engine.deltanet as D
        good = D.causal_conv
        def causal_conv(x, state, w):
            win = np.concatenate([state.T, x])     # the window before this micro-batch's update
            y = good(x, state, w)
            state[:] = win[-state.shape[1] - 1:-1].T   # kept one token too early
            return y
        D.causal_conv = causal_conv
    """, "model")
    msg = messages(rep, "model")
    assert "first at position 32;" in msg["prompt positions"]
    m = msg["delta-net state"]
    assert "first after position 31 (prompt micro-batch 1, rows 0..31) in layer 0" in m, m
    assert "conv window differs" in m and "recurrent (ssm) state equal" in m, m


def test_state_reset_between_prefill_and_decode(tmp_path, tiny35_model):
    rep = check_broken(tmp_path, tiny35_model, """
        import engine.runtime as R
        good = R.Engine.eval
        def eval(self, tokens, phase="prefill", *rest):
            if phase == "decode" and not getattr(self, "decoding", False):
                self.decoding = True
                for a in [*self.model.conv_state.values(), *self.model.ssm_state.values()]:
                    a[:] = 0
            return good(self, tokens, phase, *rest)
        R.Engine.eval = eval
    """, "model")
    st, msg = statuses(rep, "model"), messages(rep, "model")
    assert st == {"prompt positions": "pass", "decode positions": "fail", "delta-net state": "fail"}, st
    assert "(decode step 1)" in msg["decode positions"]
    P = results(rep, "model")[0]["properties"]["prompt_tokens"]
    assert f"first after position {P} (decode step 1) in layer 0" in msg["delta-net state"], msg


def test_shared_expert_gate_dropped(tmp_path, tiny35_model):
    """The shared expert's sigmoid gate (one value per row) replaced by 1: every layer's
    dumped shared-expert output differs, the routed experts' does not."""
    rep = check_broken(tmp_path, tiny35_model, FAULT_SET["the shared expert's gate dropped"].patch, "layer", "model")
    layer = messages(rep, "layer")
    assert set(statuses(rep, "layer").values()) == {"fail"}
    for m in layer.values():
        assert "shared expert output (resident, behind its sigmoid gate) differs" in m, m
        assert "MoE output differs" not in m, m
    assert "layer 0's MoE input already differs" not in messages(rep, "model")["prompt positions"]


def test_attention_output_gate_dropped(tmp_path, tiny35_model):
    """The gated attention's output gate (n_head x head_dim = 256 per row on tiny35) replaced
    by 1: the MoE blocks still match the reference on their inputs; the model suite names
    layer 3, the attention layer."""
    rep = check_broken(tmp_path, tiny35_model, """
        import engine.qwen35moe as Q
        good = Q.sigmoid
        Q.sigmoid = lambda x: np.ones_like(x) if np.shape(x)[-1] > 64 else good(x)
    """, "layer", "model")
    assert set(statuses(rep, "layer").values()) == {"pass"}
    m = messages(rep, "model")["prompt positions"]
    assert "the first layer whose MoE input differs there is layer 3" in m and "layer 3's attention" in m, m


def test_routed_expert_paging_fault_on_a_deltanet_layer(tmp_path, tiny35_model):
    """Layer 1 (delta net, the Q6_K experts) reads expert 6's bytes for expert 7."""
    rc, rep = run_check(tmp_path, tiny35_model, broken_engine(tmp_path, """
        import engine.paging.pager as P
        good = P.Pager._ranges
        P.Pager._ranges = lambda self, key, base, mem: good(self, (1, 6) if key == (1, 7) else key, base, mem)
    """), "--suites", "kernel,layer", "--set", "kernel.pairs=[[1, 6], [1, 7], [2, 7]]", "--set", "kernel.paths=[]")
    assert rc == 1
    st = statuses(rep, "kernel")
    assert st == {"L1 E6": "pass", "L1 E7": "fail", "L2 E7": "pass"}, st
    k = messages(rep, "kernel")["L1 E7"]
    assert "L1 E7 (deltanet layer, Q4_K/Q4_K/Q6_K" in k and "holds the bytes of L1 E6" in k, k
    layer = statuses(rep, "layer")
    assert layer["L1"] == "fail" and {v for n, v in layer.items() if n != "L1"} == {"pass"}, layer
    assert "expert(s) [7] differs" in messages(rep, "layer")["L1"]


def test_moe_dump_without_the_shared_expert_fails(tmp_path, tiny35_model):
    """An engine that writes version-1 MoE records on a model with a shared expert: the
    shared expert went unchecked, so the layer check fails instead of passing on the rest."""
    rep = check_broken(tmp_path, tiny35_model, """
        import engine.dumps as Dm
        from engine.model import MoETrace
        good = Dm.MoEDumpWriter.write
        Dm.MoEDumpWriter.write = lambda self, t: good(self, MoETrace(t.layer, t.h, t.selected, t.weights, t.out))
    """, "layer")
    assert set(statuses(rep, "layer").values()) == {"fail"}
    assert all("has no shared expert output (version 1 records)" in m for m in messages(rep, "layer").values())
