"""The synthetic models: real GGUF format, documented shapes and quant mix, deterministic
bytes, every expert routed on the calibration prompt, and readable by the reference."""

from __future__ import annotations

import hashlib
import json
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
from epmci.synth.writer import TensorPlan, calibration_tokens
from epmci.reference import reference_model
from epmci.reference.quants import dequantize

# sha256 of the qwen3moe presets' files (seed 0) as generator v2 wrote them before the
# qwen35moe presets were added: the golden baselines are recorded on these bytes.
QWEN3MOE_SHA256 = {
    "tiny": "d313c1c9d0f66ece6b4fa5682ba702956d882effdb434f0c548d4ce2a23b4cd5",
    "ci": "2ff2df7af4a4eecfcf6a80e34485a0658ddac1ef26fab9e40fb5e19b6d2d3b3b",
}


def sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("model", ["tiny_model", "ci_model", "tiny35_model"])
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


@pytest.mark.parametrize("preset", ["tiny", "tiny35"])
def test_same_preset_and_seed_give_identical_bytes(preset, tmp_path):
    a = make_model(preset, 0, tmp_path / "a.gguf")
    b = make_model(preset, 0, tmp_path / "b.gguf")
    c = make_model(preset, 1, tmp_path / "c.gguf")
    assert sha256(a) == sha256(b) == sha256(make_model(preset))
    assert sha256(c) != sha256(a)


@pytest.mark.parametrize("preset", sorted(QWEN3MOE_SHA256))
def test_qwen3moe_presets_are_byte_identical_to_the_recorded_files(preset, tmp_path):
    assert sha256(make_model(preset, 0, tmp_path / "m.gguf")) == QWEN3MOE_SHA256[preset]


@pytest.mark.parametrize("preset", ["tiny", "ci", "tiny35", "ci35"])
def test_calibration_prompt_routes_every_expert_and_logits_are_finite(preset):
    mf = ModelFile(make_model(preset))
    fwd = reference_model(mf).forward(calibration_tokens(PRESETS[preset], 0))
    assert np.isfinite(fwd.logits).all()
    assert fwd.logits.std() > 0.5  # not a flat distribution
    for layer, moe in enumerate(fwd.moe):
        used = np.unique(moe.selected)
        assert len(used) == mf.hp.n_expert, f"layer {layer}: experts never routed"


@pytest.mark.parametrize("preset", ["tiny35", "ci35"])
def test_qwen35_model_has_documented_shapes_and_quant_mix(preset, request):
    """Metadata and tensors as docs/qwen35moe.md lists them, llama.cpp's
    F32-only tensors in F32, exactly the tensor set it consumes, two expert sizes."""
    p, q = PRESETS[preset], PRESETS[preset].qwen35
    path = request.getfixturevalue(f"{preset}_model")
    reader = GGUFReader(path)
    t = {x.name: x for x in reader.tensors}
    A = "qwen35moe."

    def key(k):
        return reader.get_field(k).contents()
    assert key("general.architecture") == "qwen35moe"
    assert (key(A + "ssm.conv_kernel"), key(A + "ssm.state_size"), key(A + "ssm.group_count"),
            key(A + "ssm.time_step_rank")) == (q.conv_kernel, q.state_size, q.group_count, q.time_step_rank)
    assert key(A + "ssm.inner_size") == q.state_size * q.time_step_rank
    assert list(key(A + "rope.dimension_sections")) == list(q.rope_sections)
    assert key(A + "rope.dimension_count") == q.rope_dim < p.head_dim
    assert key(A + "expert_shared_feed_forward_length") == q.n_ff_shexp
    assert (key(A + "expert_count"), key(A + "expert_used_count")) == (p.n_expert, p.n_expert_used)
    E, D, H, Hkv, X, F, Fs = p.n_embd, p.head_dim, p.n_head, p.n_head_kv, p.n_expert, p.n_ff_exp, q.n_ff_shexp
    ds, V = q.state_size, q.time_step_rank
    CD = 2 * ds * q.group_count + ds * V

    def shape(name):
        return list(t[name].shape)
    kinds, down_types = [], set()
    for i in range(p.n_layer):
        b = f"blk.{i}."
        if (i + 1) % q.full_attention_interval:
            kinds.append("deltanet")
            assert shape(b + "attn_qkv.weight") == [E, CD] and shape(b + "attn_gate.weight") == [E, ds * V]
            assert shape(b + "ssm_conv1d.weight") == [q.conv_kernel, CD]
            assert shape(b + "ssm_a") == shape(b + "ssm_dt.bias") == [V]
            assert shape(b + "ssm_alpha.weight") == shape(b + "ssm_beta.weight") == [E, V]
            assert shape(b + "ssm_norm.weight") == [ds] and shape(b + "ssm_out.weight") == [ds * V, E]
            assert b + "attn_q.weight" not in t
            f32 = ["ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_norm.weight"]
            assert (np.asarray(t[b + "ssm_a"].data) < 0).all()          # -exp(A_log): a decay
        else:
            kinds.append("attention")
            assert shape(b + "attn_q.weight") == [E, 2 * H * D]       # query and gate per head
            assert shape(b + "attn_k.weight") == shape(b + "attn_v.weight") == [E, Hkv * D]
            assert shape(b + "attn_output.weight") == [H * D, E]
            assert b + "attn_qkv.weight" not in t and b + "ssm_a" not in t
            f32 = ["attn_q_norm.weight", "attn_k_norm.weight"]
        assert shape(b + "ffn_gate_exps.weight") == [E, F, X] and shape(b + "ffn_down_exps.weight") == [F, E, X]
        assert shape(b + "ffn_gate_inp_shexp.weight") == [E]
        assert shape(b + "ffn_gate_shexp.weight") == shape(b + "ffn_up_shexp.weight") == [E, Fs]
        assert shape(b + "ffn_down_shexp.weight") == [Fs, E]
        f32 += ["attn_norm.weight", "post_attention_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"]
        for name in f32:
            assert t[b + name].tensor_type == Q.F32, b + name
        assert t[b + "ffn_gate_exps.weight"].tensor_type == t[b + "ffn_up_exps.weight"].tensor_type == Q.Q4_K
        down_types.add(t[b + "ffn_down_exps.weight"].tensor_type)
    assert {"deltanet", "attention"} == set(kinds)
    assert down_types == {Q.Q5_K, Q.Q6_K}
    mf = ModelFile(path)
    assert [mf.hp.layer_kind(i) for i in range(p.n_layer)] == kinds
    assert len({mf.expert_bytes(i) for i in range(p.n_layer)}) == 2
    # llama.cpp refuses a file with a tensor it does not consume ("wrong number of tensors")
    assert set(t) == set(mf.expected_shapes())


def test_ci35_preset_sizes_fit_the_gate(ci35_model):
    p = PRESETS["ci35"]
    assert p.n_layer >= 8 and p.n_expert >= 64 and p.n_expert_used == 8 and p.qwen35.n_ff_shexp > 0
    mf = ModelFile(ci35_model)
    assert {mf.hp.layer_kind(i) for i in range(p.n_layer)} == {"deltanet", "attention"}
    assert mf.path.stat().st_size <= 300 * 2**20


def test_prod35_preset_has_the_production_layer_shape():
    """From the writer's tensor plan, without writing the ~4 GB file: the production model's
    expert sizes (1,900,544 B with Q5_K down, 2,039,808 B with Q6_K down) and layer shape."""
    p = PRESETS["prod35"]
    q = p.qwen35
    assert (p.n_embd, p.n_ff_exp, p.n_expert, p.n_expert_used, q.n_ff_shexp) == (2048, 512, 256, 8, 512)
    assert (p.n_head, p.n_head_kv, p.head_dim, q.rope_dim, q.rope_sections) == (16, 2, 256, 64, (11, 11, 10, 0))
    assert (q.group_count, q.time_step_rank, q.state_size, q.conv_kernel) == (16, 32, 128, 4)
    items = {name: (shape, qtype) for name, shape, qtype, _ in TensorPlan(p, 0).items}

    def expert_bytes(il):
        return sum(int(np.prod(items[f"blk.{il}.ffn_{part}_exps.weight"][0])) for part in ("gate", "up", "down")) // p.n_expert
    sizes = [expert_bytes(il) for il in range(p.n_layer)]
    assert set(sizes) == {1_900_544, 2_039_808}
    assert [q.is_recurrent(il) for il in range(p.n_layer)] == [(il + 1) % 4 != 0 for il in range(p.n_layer)]


def test_prod35_full_preset_has_the_production_models_shape():
    """prod35-full is the production model's shape: 40 layers (every 4th full attention),
    Q6_K down -- the larger expert -- on exactly layers 34, 38 and 39, a 248,320-token
    vocabulary, 4096 context; about 21.5 GB (checked from the tensor plan, not written)."""
    p = PRESETS["prod35-full"]
    q = p.qwen35
    assert (p.n_layer, p.n_vocab, p.n_ctx, p.n_expert, p.n_expert_used) == (40, 248320, 4096, 256, 8)
    assert [il for il in range(p.n_layer) if not q.is_recurrent(il)] == list(range(3, 40, 4))
    assert [il for il in range(p.n_layer) if p.down_type(il) == Q.Q6_K] == [34, 38, 39]
    small = PRESETS["prod35"]
    assert (p.n_embd, p.n_ff_exp, p.n_head, p.n_head_kv, p.head_dim, p.qwen35) == \
        (small.n_embd, small.n_ff_exp, small.n_head, small.n_head_kv, small.head_dim, small.qwen35)
    items = TensorPlan(p, 0).items
    total = sum(int(np.prod(shape)) * (4 if qtype == Q.F32 else 1) for _, shape, qtype, _ in items)
    assert 21.4e9 < total < 21.6e9


def test_make_is_atomic_readable_and_clears_stale_temps(tmp_path, monkeypatch):
    """A make killed by SIGKILL leaves its temp file; the next make of the same target
    removes it (a dead writer's pid is in its name) but never a live writer's. The model is
    readable like any file (umask, not mkstemp's 0600), and progress is reported."""
    import os
    from epmci.synth import writer
    out = tmp_path / "m.gguf"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale, live = tmp_path / f"m.gguf.{dead}.abc.tmp", tmp_path / f"m.gguf.{os.getppid()}.def.tmp"
    other = tmp_path / f"n.gguf.{dead}.abc.tmp"
    for f in (stale, live, other):
        f.write_bytes(b"half a model")
    seen = []
    monkeypatch.setattr(os, "umask", lambda mask=0o022: 0o022)   # read back by the writer
    writer.write_model(PRESETS["tiny"], 0, out, lambda stage, done, total: seen.append((stage, done, total)))
    assert not stale.exists() and live.exists() and other.exists()
    assert sha256(out) == sha256(make_model("tiny"))
    assert out.stat().st_mode & 0o777 == 0o644
    writes = [d for st, d, t in seen if st == "write"]
    assert writes == sorted(writes) and writes[-1] == seen[0][2]
    assert [d for st, d, t in seen if st == "calibrate"] == list(range(1, PRESETS["tiny"].n_layer + 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.gguf", live.name, other.name])


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
    assert "shared" not in r.stdout


def test_model_info_shows_layer_kinds_and_shared_expert(tiny35_model):
    r = _info(tiny35_model)
    assert r.returncode == 0, r.stderr
    assert "qwen35moe" in r.stdout and "layer kinds  1 attention, 3 deltanet" in r.stdout
    assert "shared expert FFN 256 (not paged)" in r.stdout
    rows = [l.split() for l in r.stdout.splitlines() if l.split()[:1] in (["0"], ["1"], ["2"], ["3"])]
    assert [row[1] for row in rows] == ["deltanet", "deltanet", "deltanet", "attention"]
    s = json.loads(subprocess.run([sys.executable, "-m", "epmci", "model", "info", "--json", str(tiny35_model)],
                                  capture_output=True, text=True, check=True).stdout)
    assert s["layer_kinds"] == {"attention": 1, "deltanet": 3}
    assert s["hparams"]["ssm"]["inner_size"] == 256
    assert s["layers"][0]["shared_expert"]["types"] == {"gate": "Q4_K", "up": "Q4_K", "down": "Q5_K"}
    # the shared expert is not a paged expert: not in the paged total
    assert s["total_expert_bytes"] == sum(l["expert_bytes"] for l in s["layers"]) * 8


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


def _patch_u32_key(data: bytes, key: str, value: int) -> bytes:
    """A GGUF with the u32 metadata `key` set to value (kv = key, u32 type, u32 value)."""
    at = data.index(key.encode()) + len(key)
    assert int.from_bytes(data[at:at + 4], "little") == 4   # GGUFValueType.UINT32
    return data[:at + 4] + value.to_bytes(4, "little") + data[at + 8:]


def _bad_qwen35_files(tmp_path, tiny35_model):
    data = open(tiny35_model, "rb").read()
    (tmp_path / "nokey.gguf").write_bytes(data.replace(b"qwen35moe.ssm.state_size", b"qwen35moe.ssm.state_sizX"))
    (tmp_path / "inner.gguf").write_bytes(_patch_u32_key(data, "qwen35moe.ssm.inner_size", 300))
    (tmp_path / "groups.gguf").write_bytes(_patch_u32_key(data, "qwen35moe.ssm.group_count", 3))
    return {
        "ssm-key-missing": (tmp_path / "nokey.gguf", "missing metadata key qwen35moe.ssm.state_size"),
        "inner-size": (tmp_path / "inner.gguf", "ssm.inner_size is 300, expected ssm.state_size 64 x "
                                                "ssm.time_step_rank 4 = 256"),
        "group-count": (tmp_path / "groups.gguf", "not a multiple of ssm.group_count 3"),
    }


@pytest.mark.parametrize("case", ["missing", "empty", "truncated", "header", "not-gguf", "other-arch",
                                  "ssm-key-missing", "inner-size", "group-count"])
def test_model_info_bad_input_is_one_line_exit_2(case, tmp_path, request):
    if case in ("ssm-key-missing", "inner-size", "group-count"):
        path, word = _bad_qwen35_files(tmp_path, request.getfixturevalue("tiny35_model"))[case]
    else:
        path, word = _bad_files(tmp_path, request.getfixturevalue("tiny_model"))[case]
    r = _info(path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(path) in lines[0] and word in lines[0]
    assert "Traceback" not in r.stderr


def test_make_progress_prints_a_line_per_tenth_when_not_a_terminal():
    """`epmci model make`'s bar on a log (CI): one line per tenth and stage, not one per tensor."""
    import io
    from epmci.cli.model import MakeProgress
    out = io.StringIO()
    bar = MakeProgress(out)
    for done in [*range(0, 1000, 7), 1000]:
        bar("write", done, 1000)
    for layer in range(1, 41):
        bar("calibrate", layer, 40)
    lines = out.getvalue().splitlines()
    percents = [int(l.split("]")[1].split("%")[0]) for l in lines]
    assert [l.split()[0] for l in lines] == ["write"] * 11 + ["calibrate"] * 11
    assert percents == list(range(0, 101, 10)) + [2, *range(10, 101, 10)]   # layer 1 of 40: 2 %
    assert "GB" in lines[10] and "layer 40/40" in lines[-1]
