"""The qwen35moe dumps of the contract, written by the engine CLI and read by the gate: MoE
dump version 2 (the shared expert apart), the delta-net state dump; and the readers'
refusals of a dump that does not follow the contract."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from epmci.contract.outputs import ContractError, read_logits, read_moe_dump, read_state_dump
from epmci.gguf.file import ModelFile
from epmci.reference import reference_model
from epmci.reference.moe import shared_expert
from epmci.reference.tokenizer import ReferenceTokenizer


@pytest.fixture(scope="module")
def dumped(tiny35_model, tmp_path_factory):
    """One CLI run on tiny35 in micro-batches of 5, with both dumps and the logits."""
    d = tmp_path_factory.mktemp("dumps")
    env = {"SDQ_MOE_DUMP": str(d / "moe"), "SDQ_STATE_DUMP": str(d / "state")}
    r = subprocess.run([sys.executable, "-m", "engine", "-m", str(tiny35_model), "-p", "hello world, once more",
                        "-n", "4", "-b", "5", "--no-chat", "--no-pager", "--dump-logits", "--logits-out",
                        str(d / "logits.bin")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    return d, ModelFile(tiny35_model)


def shapes(mf):
    s = mf.hp.ssm
    return (s.conv_dim, s.conv_kernel - 1), (s.time_step_rank, s.state_size, s.state_size)


def test_state_dump_per_deltanet_layer_equals_reference_after_each_micro_batch(dumped):
    d, mf = dumped
    assert sorted(p.name for p in d.glob("state.*")) == ["state.0", "state.1", "state.2"]   # layer 3 attends
    rows = read_logits(d / "logits.bin").shape[0]
    recs = {il: read_state_dump(d / f"state.{il}", il, *shapes(mf)) for il in (0, 1, 2)}
    ends = [r.position for r in recs[0]]
    P = rows - 3                                   # 4 generated, 3 fed back
    assert ends == [*range(4, P - 1, 5), P - 1, *range(P, rows)]
    # the reference on the run's own tokens: the prompt's and the greedy ones fed back
    ids = ReferenceTokenizer.of(mf).encode("hello world, once more", parse_special=False)
    fed = np.argmax(read_logits(d / "logits.bin")[P - 1:-1], axis=1).tolist()
    assert len(ids) == P
    ref = reference_model(mf).forward(ids + fed, state_after=ends)
    for il, layer_recs in recs.items():
        for r in layer_recs:
            want = ref.states[r.position][il]
            assert r.conv.tobytes() == want.conv.tobytes() and r.ssm.tobytes() == want.ssm.tobytes(), (il, r.position)


def test_moe_dump_version_2_carries_the_gated_shared_expert(dumped):
    d, mf = dumped
    for il in range(mf.hp.n_layer):
        rec = read_moe_dump(d / f"moe.{il}", layer=il, n_embd=mf.hp.n_embd, k=mf.hp.n_expert_used).concat()
        assert rec.shared.shape == rec.out.shape
        assert rec.shared.tobytes() == shared_expert(mf, il, rec.h).tobytes(), il


def test_state_dump_reader_refuses_what_the_contract_does_not_allow(dumped, tmp_path):
    d, mf = dumped
    conv, ssm = shapes(mf)
    good = (d / "state.1").read_bytes()
    rec_bytes = 4 + 32 + 4 * (int(np.prod(conv)) + int(np.prod(ssm)))
    cases = {
        "truncated": (good[:-10], "truncated"),
        "empty": (b"", "empty dump"),
        "magic": (b"EPMX" + good[4:], "bad magic"),
        "version": (good[:4] + struct.pack("<I", 9) + good[8:], "version 9"),
        "gap": (good[rec_bytes:], "expected a micro-batch from 0"),   # the first micro-batch missing
    }
    for name, (data, word) in cases.items():
        p = tmp_path / f"state.{name}"
        p.write_bytes(data)
        with pytest.raises(ContractError, match=word):
            read_state_dump(p, 1, conv, ssm)
    with pytest.raises(ContractError, match="layer 1, expected 2"):
        read_state_dump(d / "state.1", 2, conv, ssm)
    with pytest.raises(ContractError, match="state shapes"):
        read_state_dump(d / "state.1", 1, conv, (ssm[0] * 2, ssm[1], ssm[2]))


def test_moe_dump_reader_refuses_mixed_versions(dumped, tmp_path):
    d, mf = dumped
    b = (d / "moe.0").read_bytes()
    n, e, k = struct.unpack_from("<3I", b, 12)
    first = 24 + 4 * (3 * n * e + 2 * n * k)             # one version-2 record
    v1 = b[:4] + struct.pack("<I", 1) + b[8:first - 4 * n * e]
    p = tmp_path / "moe.mixed"
    p.write_bytes(b[:first] + v1)
    with pytest.raises(ContractError, match="after records of another version"):
        read_moe_dump(p)
