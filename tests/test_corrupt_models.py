"""Corrupt model files: every entry point answers with one line naming the file, exit 2.

A seeded corpus of about 100 damaged copies of the tiny model (truncations at many offsets,
header count fields, byte flips in the metadata and the tensor infos, foreign
architectures, values of the wrong type, impossible tensor infos, invalid UTF-8 and
duplicate tokens) goes to the engine CLI and to `epmci model info` in-process (a process
per variant would spend its time importing numba), to a sample of `epmci check`, `epmci
build` and `epmci golden update`, and to the engine as a subprocess, to show that no
traceback reaches stderr. Damage that leaves a valid file (a flipped byte inside a float,
say) may run; everything else is refused before the engine reads a weight. Corrupt golden
files get the same treatment from `epmci golden show` and `epmci golden diff`.
"""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from gguf import GGUFReader

import engine.cli as engine_cli
from epmci.cli import main as epmci_main

SEED = 18
ROOT = Path(__file__).resolve().parents[1]
BOTH, ENGINE_ONLY, NOBODY = frozenset({"engine", "epmci"}), frozenset({"engine"}), frozenset()


@dataclass(frozen=True)
class Variant:
    id: str
    refused_by: frozenset        # who must answer exit 2; the others may also run it
    make: object                 # original bytes -> damaged bytes

    def write(self, original: bytes, path: Path) -> Path:
        path.write_bytes(self.make(original))
        return path


@dataclass(frozen=True)
class Layout:
    """Where the tiny model's parts are, read once with gguf-py: part offsets per field."""
    size: int
    ti_start: int                # first tensor info
    data_start: int
    data_end: int                # end of the last tensor's bytes
    fields: dict                 # metadata key -> (offset of each part, size of each part)
    tensor_fields: dict          # tensor name -> (offset of each part, size of each part)

    @classmethod
    def of(cls, path: Path) -> "Layout":
        r = GGUFReader(path)
        base = r.data.ctypes.data

        def parts(f):
            return [p.ctypes.data - base for p in f.parts], [p.nbytes for p in f.parts]

        return cls(size=len(r.data), ti_start=r.tensors[0].field.offset,
                   data_start=min(int(t.data_offset) for t in r.tensors),
                   data_end=max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors),
                   fields={k: parts(f) for k, f in r.fields.items() if not k.startswith("GGUF.")},
                   tensor_fields={t.name: parts(t.field) for t in r.tensors})


def _patch(at: int, new: bytes):
    return lambda b: b[:at] + new + b[at + len(new):]


def _truncate(at: int):
    return lambda b: b[:at]


def corpus(lay: Layout, original: bytes) -> list[Variant]:
    rng = random.Random(SEED)
    out: list[Variant] = []

    # truncations: the header, every region, the last byte a tensor needs
    cuts = [1, 4, 8, 12, 20, 24, 25]
    cuts += sorted(rng.sample(range(24, lay.ti_start), 8))
    cuts += sorted(rng.sample(range(lay.ti_start, lay.data_start), 6))
    cuts += [lay.data_start]
    cuts += sorted(rng.sample(range(lay.data_start, lay.data_end), 6))
    cuts += [lay.data_end - 1]
    out += [Variant(f"truncated-at-{c}", BOTH, _truncate(c)) for c in cuts]

    # header: version, tensor count, metadata count
    out += [Variant(f"version-{v}", BOTH, _patch(4, struct.pack("<I", v)))
            for v in (0, 1, 4, 0xFFFF, 0xFFFFFFFF)]
    for name, at, n in (("tensor-count", 8, len(lay.tensor_fields)), ("kv-count", 16, len(lay.fields))):
        for v in (0, n + 1, 1 << 40, (1 << 64) - 1):
            out += [Variant(f"{name}-{v}", BOTH, _patch(at, struct.pack("<Q", v)))]
    # one tensor fewer drops the last one (output.weight: the embedding is then tied, a valid
    # model); one key fewer makes the tensor infos start inside the last key
    out += [Variant("tensor-count-minus-1", NOBODY, _patch(8, struct.pack("<Q", len(lay.tensor_fields) - 1))),
            Variant("kv-count-minus-1", BOTH, _patch(16, struct.pack("<Q", len(lay.fields) - 1)))]

    # random byte flips in the metadata and in the tensor infos
    for region, lo, hi, k in (("metadata", 24, lay.ti_start, 20),
                              ("tensor-info", lay.ti_start, lay.data_start, 15)):
        for at in sorted(rng.sample(range(lo, hi), k)):
            out += [Variant(f"flip-{region}-{at}", NOBODY,
                            _patch(at, bytes([original[at] ^ rng.randrange(1, 256)])))]

    # a foreign architecture: the name alone, and a coherent file of it
    out += [Variant("arch-qwen2moe", BOTH, _patch(lay.fields["general.architecture"][0][-1], b"qwen2moe")),
            Variant("arch-qwen2moe-keys", BOTH, lambda b: b.replace(b"qwen3moe", b"qwen2moe"))]

    # metadata values of the wrong type, of the same size (so the rest still parses)
    def retype(key, part, gtype):
        return _patch(lay.fields[key][0][part], struct.pack("<I", gtype))
    out += [Variant("block-count-as-float", BOTH, retype("qwen3moe.block_count", 2, 6)),
            Variant("expert-count-as-int32", NOBODY, retype("qwen3moe.expert_count", 2, 5)),
            Variant("rms-eps-as-uint32", NOBODY, retype("qwen3moe.attention.layer_norm_rms_epsilon", 2, 4)),
            Variant("add-bos-as-uint8", NOBODY, retype("tokenizer.ggml.add_bos_token", 2, 0)),
            Variant("token-types-as-float", BOTH, retype("tokenizer.ggml.token_type", 3, 6))]

    # tensor infos that parse but describe tensors the file cannot hold
    def tensor_part(name, part, value, fmt):
        return _patch(lay.tensor_fields[name][0][part], struct.pack(fmt, value))

    def tensor_offset(name):
        at = lay.tensor_fields[name][0][5]
        return struct.unpack_from("<Q", original, at)[0]
    down1 = "blk.1.ffn_down_exps.weight"
    out += [Variant("tensor-type-unknown", BOTH, tensor_part("blk.0.attn_q.weight", 4, 99, "<I")),
            Variant("tensor-type-unsupported", ENGINE_ONLY, tensor_part("blk.0.attn_q.weight", 4, 2, "<I")),
            Variant("tensor-row-not-whole-blocks", BOTH, tensor_part("blk.0.attn_q.weight", 3, 255, "<Q")),
            Variant("tensor-ndims-0", BOTH, tensor_part("output_norm.weight", 2, 0, "<I")),
            Variant("tensor-offset-past-end", BOTH, tensor_part(down1, 5, lay.size, "<Q")),
            Variant("tensor-offset-unaligned", BOTH, tensor_part(down1, 5, tensor_offset(down1) + 1, "<Q"))]

    # invalid UTF-8 in strings the engine and epmci read
    def string_byte(key, part, byte=b"\xff"):
        return _patch(lay.fields[key][0][part], byte)
    tokens_off, tokens_size = lay.fields["tokenizer.ggml.tokens"]
    out += [Variant("utf8-token", BOTH, string_byte("tokenizer.ggml.tokens", 6 + 2 * 100)),
            Variant("utf8-token-cut-sequence", BOTH,      # a 2-byte sequence's lead as the last byte
                    _patch(tokens_off[6 + 2 * 200] + tokens_size[6 + 2 * 200] - 1, b"\xc3")),
            Variant("utf8-merge", BOTH, string_byte("tokenizer.ggml.merges", 6 + 2 * 10)),
            Variant("utf8-general-name", BOTH, string_byte("general.name", 4)),
            Variant("utf8-tokenizer-pre", BOTH, string_byte("tokenizer.ggml.pre", 4)),
            Variant("utf8-tokenizer-model", BOTH, string_byte("tokenizer.ggml.model", 4)),
            Variant("utf8-key-name", BOTH, string_byte("qwen3moe.block_count", 1)),
            Variant("utf8-tensor-name", BOTH, _patch(lay.tensor_fields["token_embd.weight"][0][1], b"\xff"))]

    # duplicate tokens: a token overwritten with another of the same length
    n_tokens = (len(tokens_off) - 5) // 2
    token = {i: original[tokens_off[6 + 2 * i]:tokens_off[6 + 2 * i] + tokens_size[6 + 2 * i]]
             for i in range(n_tokens)}
    by_len: dict[int, list[int]] = {}
    for i, t in token.items():
        by_len.setdefault(len(t), []).append(i)
    pairs = [ids[-2:] for n, ids in sorted(by_len.items()) if len(ids) >= 2][:3]
    out += [Variant(f"duplicate-token-{a}-{b}", BOTH, _patch(tokens_off[6 + 2 * b], token[a]))
            for a, b in pairs]
    return out


# --------------------------------------------------------------------- running the entry points

def _one_line_error(rc, err: str, prefix: str, path: Path) -> str | None:
    """None if (rc, stderr) is the answer to a bad file: exit 2, one line naming it."""
    lines = err.strip().splitlines()
    if rc != 2:
        return f"exit {rc}"
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr"
    if not lines[0].startswith(f"{prefix}{path}: "):
        return f"line does not start with {prefix}{path}: "
    return None


def _in_process(main, argv: list[str], capsys) -> tuple[object, str]:
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:      # argparse; a traceback-free exit all the same
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_bytes(tiny_model) -> bytes:
    return tiny_model.read_bytes()


@pytest.fixture(scope="module")
def variants(tiny_model, tiny_bytes) -> dict[str, Variant]:
    return {v.id: v for v in corpus(Layout.of(tiny_model), tiny_bytes)}


def _sweep(variants, tiny_bytes, tmp_path, who: str, run, prefix: str) -> None:
    """Run every variant through one entry point; report every variant that was not
    answered as it should be, all at once."""
    bad, refused = [], 0
    for v in variants.values():
        path = v.write(tiny_bytes, tmp_path / f"{v.id}.gguf")
        rc, err = run(path)
        path.unlink()
        problem = _one_line_error(rc, err, prefix, path)
        if rc == 0 and who not in v.refused_by:
            continue
        if problem:
            bad.append(f"  {v.id}: {problem}: {err.strip()[-300:]!r}")
        refused += 1
    assert not bad, f"{who}: {len(bad)} corrupt variants not answered with one line and exit 2:\n" + "\n".join(bad)
    assert refused >= 0.7 * len(variants), f"{who} refused only {refused} of {len(variants)}"


def test_the_corpus_is_seeded_and_covers_every_kind_of_damage(tiny_model, tiny_bytes, variants):
    again = corpus(Layout.of(tiny_model), tiny_bytes)
    assert [v.id for v in again] == list(variants)
    assert all(a.make(tiny_bytes) == variants[a.id].make(tiny_bytes) for a in again[::7])
    assert 90 <= len(variants) <= 120, len(variants)
    kinds = ("truncated", "version", "tensor-count", "kv-count", "flip-metadata", "flip-tensor-info",
             "arch", "-as-", "tensor-", "utf8-token", "utf8-general-name", "duplicate-token")
    for kind in kinds:
        assert sum(kind in i for i in variants) >= 1, kind
    assert all(v.make(tiny_bytes) != tiny_bytes for v in variants.values())


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")   # garbage weights that run
def test_engine_answers_every_corrupt_variant_in_one_line(variants, tiny_bytes, tmp_path, capsys):
    def run(path):
        return _in_process(engine_cli.main, ["-m", str(path), "-p", "hi", "-n", "1"], capsys)
    _sweep(variants, tiny_bytes, tmp_path, "engine", run, "epm-engine: error: ")


def test_model_info_answers_every_corrupt_variant_in_one_line(variants, tiny_bytes, tmp_path, capsys):
    def run(path):
        return _in_process(epmci_main, ["model", "info", str(path)], capsys)
    _sweep(variants, tiny_bytes, tmp_path, "epmci", run, "epmci: error: ")


CLI_SAMPLE = ("truncated-at-25", "kv-count-1099511627776", "tensor-offset-unaligned", "arch-qwen2moe",
              "block-count-as-float", "utf8-token", "utf8-general-name", "duplicate-token-92-93")


@pytest.mark.parametrize("command", [
    ["check", "-q", "--no-build"],
    ["build"],
    ["golden", "update", "--profile", "corrupt-model", "--reason", "a corrupt model"],
], ids=lambda c: " ".join(c[:2]))
def test_epmci_commands_refuse_a_sample_before_running_the_engine(command, variants, tiny_bytes, tmp_path, capsys):
    out = tmp_path / "out"
    bad = []
    for vid in CLI_SAMPLE:
        path = variants[vid].write(tiny_bytes, tmp_path / f"{vid}.gguf")
        argv = [*command, "--model", str(path), "--set", f"perf.golden_dir={out / 'golden'}"]
        if command[0] == "check":
            argv += ["--workdir", str(out / vid), "--json", str(out / f"{vid}.json")]
        rc, err = _in_process(epmci_main, argv, capsys)
        if problem := _one_line_error(rc, err, "epmci: error: ", path):
            bad.append(f"  {vid}: {problem}: {err.strip()[-300:]!r}")
    assert not bad, f"epmci {command[0]}:\n" + "\n".join(bad)
    assert not (out / "golden").exists()             # nothing half-written


@pytest.mark.parametrize("vid", ["utf8-token", "duplicate-token-92-93", "truncated-at-1001279",
                                 "tensor-type-unsupported"])
def test_engine_process_prints_one_line_and_no_traceback(vid, variants, tiny_bytes, tmp_path):
    path = variants[vid].write(tiny_bytes, tmp_path / f"{vid}.gguf")
    r = subprocess.run([sys.executable, "-m", "engine", "-m", str(path), "-p", "hi", "-n", "1"],
                       capture_output=True, text=True, timeout=300)
    assert _one_line_error(r.returncode, r.stderr, "epm-engine: error: ", path) is None, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_the_problem_is_named(variants, tiny_bytes, tmp_path, capsys):
    """The one line says what is wrong, in words a user can act on."""
    want = {"utf8-token": "tokenizer.ggml.tokens[100] is not valid UTF-8",
            "utf8-general-name": "general.name is not valid UTF-8",
            "duplicate-token-92-93": "duplicate token in vocabulary",
            "tensor-offset-unaligned": "blk.1.ffn_down_exps.weight",
            "block-count-as-float": ("block_count", "n_layer is 0"),
            "token-types-as-float": "tokenizer.ggml.token_type",
            "arch-qwen2moe": "qwen2moe"}
    for vid, words in want.items():
        path = variants[vid].write(tiny_bytes, tmp_path / f"{vid}.gguf")
        for main, argv in ((engine_cli.main, ["-m", str(path), "-p", "hi"]),
                           (epmci_main, ["model", "info", str(path)])):
            rc, err = _in_process(main, argv, capsys)
            assert rc == 2 and any(w in err for w in ((words,) if isinstance(words, str) else words)), (vid, err)


# --------------------------------------------------------------------- corrupt golden files

def _golden_variants(yaml_bytes: bytes, side_name: str) -> list[tuple[str, str, object]]:
    """(id, which file, damage) for the shipped golden pair."""
    rng = random.Random(SEED)
    out = [(f"yaml-truncated-at-{n}", "yaml", _truncate(n))
           for n in sorted(rng.sample(range(1, len(yaml_bytes)), 8))]
    out += [(f"yaml-flip-{n}", "yaml", _patch(n, bytes([yaml_bytes[n] ^ rng.randrange(1, 256)])))
            for n in sorted(rng.sample(range(len(yaml_bytes)), 8))]
    out += [("yaml-empty", "yaml", _truncate(0)),
            ("yaml-not-utf8", "yaml", _patch(0, b"\xff\xfe")),
            ("yaml-binary", "yaml", lambda b: bytes(range(256)) * 4),
            ("yaml-side-renamed", "yaml", lambda b: b.replace(side_name.encode(), b"elsewhere.logits")),
            ("side-truncated", "side", lambda b: b[:len(b) // 2]),
            ("side-flipped", "side", lambda b: b[:-1] + bytes([b[-1] ^ 1])),
            ("side-empty", "side", _truncate(0))]
    return out


def test_golden_commands_answer_a_corrupt_golden_in_one_line(tmp_path, capsys):
    src = ROOT / "golden" / "epm-8gb" / "ci-seed0-gen2.yaml"
    good = tmp_path / "good" / src.name
    good.parent.mkdir()
    shutil.copy(src, good)
    side = next(src.parent.glob("ci-seed0-gen2.*.logits"))
    shutil.copy(side, good.parent / side.name)
    assert _in_process(epmci_main, ["golden", "show", str(good)], capsys)[0] == 0
    bad = []
    for vid, which, damage in _golden_variants(src.read_bytes(), side.name):
        d = tmp_path / vid
        d.mkdir()
        y, s = d / src.name, d / side.name
        y.write_bytes(src.read_bytes())
        s.write_bytes(side.read_bytes())
        target = y if which == "yaml" else s
        target.write_bytes(damage(target.read_bytes()))
        for argv in (["golden", "show", str(y)], ["golden", "diff", str(good), str(y)]):
            rc, err = _in_process(epmci_main, argv, capsys)
            if rc in (0, 1) and which == "yaml" and ("flip" in vid or "truncated" in vid):
                continue    # a flipped digit, or a cut inside the last counters: may still be a golden
            problem = _one_line_error(rc, err, "epmci: error: ", y)
            if problem and not (which == "side" and _one_line_error(rc, err, "epmci: error: ", s) is None):
                bad.append(f"  {vid} ({argv[1]}): {problem}: {err.strip()[-300:]!r}")
    assert not bad, "corrupt golden files not answered with one line and exit 2:\n" + "\n".join(bad)


def test_golden_cut_short_is_refused(tmp_path, capsys):
    """A golden file cut anywhere is refused, not read as a golden with fewer counters (today
    every prompt's counters must have the phases and fields of the first)."""
    src = ROOT / "golden" / "epm-8gb" / "ci-seed0-gen2.yaml"
    side = next(src.parent.glob("ci-seed0-gen2.*.logits"))
    shutil.copy(side, tmp_path / side.name)
    y = tmp_path / src.name
    for vid, which, damage in _golden_variants(src.read_bytes(), side.name):
        if vid.startswith("yaml-truncated"):
            y.write_bytes(damage(src.read_bytes()))
            rc, err = _in_process(epmci_main, ["golden", "show", str(y)], capsys)
            assert _one_line_error(rc, err, "epmci: error: ", y) is None, (vid, rc, err)


@pytest.mark.parametrize("command", [["check", "-q", "--no-build"], ["build"]], ids=lambda c: c[0])
def test_epmci_answers_a_model_only_the_engine_refuses_in_one_line(command, variants, tiny_bytes, tmp_path, capsys):
    """A model epmci can read but the engine cannot run (a Q4_0 tensor: the engine answers
    exit 2 in one line) is the tool not being able to run: exit 2, that one line."""
    path = variants["tensor-type-unsupported"].write(tiny_bytes, tmp_path / "q4_0.gguf")
    argv = [*command, "--model", str(path)]
    if command[0] == "check":
        argv += ["--workdir", str(tmp_path / "w"), "--json", str(tmp_path / "r.json")]
    rc, err = _in_process(epmci_main, argv, capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "unsupported type Q4_0" in err, (rc, err)
