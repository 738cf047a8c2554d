"""The synthetic models: real GGUF format, documented shapes and quant mix, deterministic
bytes, every expert routed on the calibration prompt, and readable by the reference."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from epmci.gguf.file import ModelFile
from epmci.synth.presets import PRESETS, TENSOR_TYPES
from epmci.synth.store import make_model
from epmci.synth.writer import calibration_tokens
from epmci.reference.model import ReferenceModel
from epmci.reference.quants import dequantize


def sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("model", ["tiny_model", "ci_model"])
def test_reference_dequantize_equals_gguf_py_on_every_tensor(model, request):
    reader = GGUFReader(request.getfixturevalue(model))
    checked = 0
    for t in reader.tensors:
        if t.tensor_type in (Q.F32, Q.F16):
            continue
        raw = np.asarray(t.data)
        mine = dequantize(raw, t.tensor_type)
        theirs = gguf_dequantize(raw, t.tensor_type)
        assert mine.shape == theirs.shape, t.name
        assert np.array_equal(mine.view(np.uint32), theirs.astype(np.float32).view(np.uint32)), t.name
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("preset", ["tiny", "ci"])
def test_made_model_has_documented_shapes_and_quant_mix(preset):
    p = PRESETS[preset]
    reader = GGUFReader(make_model(preset))
    tensors = {t.name: t for t in reader.tensors}
    arch = reader.get_field("general.architecture").contents()
    assert arch == "qwen3moe"
    assert reader.get_field("qwen3moe.expert_count").contents() == p.n_expert
    assert reader.get_field("qwen3moe.expert_used_count").contents() == p.n_expert_used
    assert reader.get_field("tokenizer.ggml.model").contents() == "gpt2"
    assert len(reader.get_field("tokenizer.ggml.tokens").contents()) == p.n_vocab
    assert reader.get_field("tokenizer.ggml.merges").contents()
    E, F, X, D = p.n_embd, p.n_ff_exp, p.n_expert, p.head_dim
    down_types = set()
    for i in range(p.n_layer):
        b = f"blk.{i}."
        assert list(tensors[b + "ffn_gate_exps.weight"].shape) == [E, F, X]
        assert list(tensors[b + "ffn_down_exps.weight"].shape) == [F, E, X]
        assert list(tensors[b + "attn_q.weight"].shape) == [E, p.n_head * D]
        assert tensors[b + "ffn_gate_inp.weight"].tensor_type == Q.F32
        assert tensors[b + "attn_norm.weight"].tensor_type == Q.F32
        assert tensors[b + "ffn_gate_exps.weight"].tensor_type == Q.Q4_K
        assert tensors[b + "ffn_up_exps.weight"].tensor_type == Q.Q4_K
        down_types.add(tensors[b + "ffn_down_exps.weight"].tensor_type)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            assert tensors[b + name + ".weight"].tensor_type == TENSOR_TYPES[name]
    # Q5_K down on most layers, Q6_K on a few including the last: two expert sizes.
    assert down_types == {Q.Q5_K, Q.Q6_K}
    assert tensors[f"blk.{p.n_layer - 1}.ffn_down_exps.weight"].tensor_type == Q.Q6_K
    mf = ModelFile(make_model(preset))
    assert len({mf.expert_bytes(i) for i in range(p.n_layer)}) == 2


def test_ci_preset_sizes_fit_the_gate():
    p = PRESETS["ci"]
    assert p.n_layer >= 8 and p.n_expert == 64 and p.n_expert_used >= 4
    assert p.n_embd % 256 == 0 and p.n_ff_exp % 256 == 0
    mf = ModelFile(make_model("ci"))
    total = sum(mf.expert_bytes(i) for i in range(p.n_layer)) * p.n_expert
    assert total >= 4 * 24 * 2**20          # 4x the default 24 MiB arena of epmci.yaml
    assert mf.path.stat().st_size <= 300 * 2**20


def test_same_preset_and_seed_give_identical_bytes(tmp_path, tiny_model):
    a = make_model("tiny", 0, tmp_path / "a.gguf")
    b = make_model("tiny", 0, tmp_path / "b.gguf")
    c = make_model("tiny", 1, tmp_path / "c.gguf")
    assert sha256(a) == sha256(b) == sha256(tiny_model)
    assert sha256(c) != sha256(a)


@pytest.mark.parametrize("preset", ["tiny", "ci"])
def test_calibration_prompt_routes_every_expert_and_logits_are_finite(preset):
    mf = ModelFile(make_model(preset))
    fwd = ReferenceModel(mf).forward(calibration_tokens(PRESETS[preset], 0))
    assert np.isfinite(fwd.logits).all()
    assert fwd.logits.std() > 0.5  # not a flat distribution
    for layer, moe in enumerate(fwd.moe):
        used = np.unique(moe.selected)
        assert len(used) == mf.hp.n_expert, f"layer {layer}: experts never routed"


def _top8_share(path, tokens) -> float:
    """Mean over layers of the share of routed slots taken by a layer's 8 busiest experts."""
    from collections import Counter

    from engine.runtime import Engine, Options
    eng = Engine(str(path), Options(n_ctx=256, batch=32, pager=False))
    cnt: Counter = Counter()
    eng.on_moe(lambda t: cnt.update((t.layer, int(e)) for e in t.selected.ravel()))
    try:
        eng.eval(tokens)
    finally:
        eng.close()
    hp = eng.gm.hp
    return float(np.mean([sum(sorted((cnt[(l, e)] for e in range(hp.n_expert)), reverse=True)[:8])
                          / (len(tokens) * hp.n_expert_used) for l in range(hp.n_layer)]))


def test_ci_skew_differs_from_ci_only_in_routers_and_routes_to_few_experts(ci_model):
    skew, ci = ModelFile(make_model("ci-skew")), ModelFile(ci_model)
    def data(mf, name):
        t = mf.tensor(name)
        with open(mf.path, "rb") as f:
            f.seek(t.offset)
            return f.read(t.n_bytes)
    for name in ci.tensors:
        assert (data(skew, name) == data(ci, name)) != name.endswith("ffn_gate_inp.weight"), name
    tokens = np.random.default_rng(1).integers(0, 1000, 128).tolist()
    # uniform popularity would give 8/64 = 12.5 %; ci's hidden states already favour some
    # experts, ci-skew's router makes about half of all lookups go to 8 of 64
    assert _top8_share(ci.path, tokens) < 0.3 < 0.45 < _top8_share(skew.path, tokens)


def _info(path):
    return subprocess.run([sys.executable, "-m", "epmci", "model", "info", str(path)],
                          capture_output=True, text=True)


def test_model_info_prints_layout(tiny_model):
    r = _info(tiny_model)
    assert r.returncode == 0, r.stderr
    assert "qwen3moe" in r.stdout and "distinct expert sizes  2" in r.stdout
    assert "Q6_K" in r.stdout and "Q5_K" in r.stdout


def _bad_files(tmp_path, tiny_model):
    data = open(tiny_model, "rb").read()
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "trunc.gguf").write_bytes(data[: len(data) // 2])
    (tmp_path / "header.gguf").write_bytes(data[:200])
    (tmp_path / "text.gguf").write_text("hello, not a model\n" * 10)
    other = data.replace(b"qwen3moe", b"qwen3xyz")  # a GGUF of another architecture
    (tmp_path / "other.gguf").write_bytes(other)
    return {
        "missing": (tmp_path / "nope.gguf", "no such file"),
        "empty": (tmp_path / "empty.gguf", "empty"),
        "truncated": (tmp_path / "trunc.gguf", "truncated"),
        "header": (tmp_path / "header.gguf", "GGUF"),
        "not-gguf": (tmp_path / "text.gguf", "not a GGUF"),
        "other-arch": (tmp_path / "other.gguf", "architecture"),
    }


@pytest.mark.parametrize("case", ["missing", "empty", "truncated", "header", "not-gguf", "other-arch"])
def test_model_info_bad_input_is_one_line_exit_2(case, tmp_path, tiny_model):
    path, word = _bad_files(tmp_path, tiny_model)[case]
    r = _info(path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(path) in lines[0] and word in lines[0]
    assert "Traceback" not in r.stderr
