"""The engine's own GGUF header parser (engine/gguf_file.py) reads what gguf-py reads: every
metadata value, every tensor's name, shape, type and data offset, on the presets and on a
file with a value of every GGUF type; and it refuses what is not a GGUF header with a
reason (the whole corrupt-file corpus goes through the engine in test_corrupt_models.py).
The resident copies of the dense tensors hold the file's bytes, in memory asked for on huge
pages."""

from __future__ import annotations

import os
import struct

import gguf
import numpy as np
import pytest

from engine.gguf_file import GGUFFile, GGUFFormatError, GGUFStringError
from engine.gguf_model import GGUFModel


def same_as_gguf_py(path) -> None:
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]   # gguf-py's header pseudo-fields
    assert list(ours.fields) == keys
    for k in keys:
        a, b = ours.fields[k], theirs.fields[k]
        assert [a.type] + ([a.item_type] if a.item_type is not None else []) == [int(t) for t in b.types], k
        want = b.contents()
        assert a.contents() == want, k
        assert type(a.contents()) is type(want), k
    assert ours.alignment == theirs.alignment and ours.data_offset == theirs.data_offset
    assert [(t.name, t.shape, t.ggml_type, ours.data_offset + t.offset) for t in ours.tensors] == \
           [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset)) for t in theirs.tensors]


def test_presets_read_as_gguf_py_reads_them(tiny_model, tiny35_model):
    for path in (tiny_model, tiny35_model):
        same_as_gguf_py(path)


def every_type_file(path, alignment: int | None = None):
    w = gguf.GGUFWriter(str(path), arch="qwen3moe")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 1 << 60)
    w.add_int64("t.i64", -(1 << 60))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.strs", ["a", "", "日本"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, 2.25])
    w.add_tensor("a", np.arange(32, dtype=np.float32).reshape(2, 16))
    w.add_tensor("b", np.ones(5, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_a_value_of_every_type_and_a_custom_alignment(tmp_path, alignment):
    path = every_type_file(tmp_path / "t.gguf", alignment)
    same_as_gguf_py(path)
    f = GGUFFile(path)
    assert f.fields["t.strs"].contents() == ["a", "", "日本"] and f.fields["t.u64"].contents() == 1 << 60
    assert f.data_offset % (alignment or 32) == 0
    a = f.tensors[0]
    start = f.data_offset + a.offset
    assert f.data[start:start + 128].view(np.float32).tolist() == list(range(32))


def _damaged(tmp_path, name, edit):
    b = bytearray(every_type_file(tmp_path / "src.gguf").read_bytes())
    edit(b)
    p = tmp_path / name
    p.write_bytes(bytes(b))
    return p


@pytest.mark.parametrize("name,edit,words", [
    ("truncated", lambda b: b.__delitem__(slice(60, None)), "truncated"),
    ("version", lambda b: b.__setitem__(slice(4, 8), struct.pack("<I", 7)), "GGUF version 7"),
    ("kv count", lambda b: b.__setitem__(slice(16, 24), struct.pack("<Q", 1 << 40)), "truncated"),
    ("bad utf-8", lambda b: b.__setitem__(b.index(b"h\xc3\xa9llo") + 1, 0xFF), "t.str is not valid UTF-8"),
    ("duplicate key", lambda b: b.__setitem__(slice(b.index(b"t.i8"), b.index(b"t.i8") + 4), b"t.u8"),
     "t.u8 appears twice"),
    ("array type", lambda b: b.__setitem__(slice(b.index(b"t.ints") + 10, b.index(b"t.ints") + 14),
                                           struct.pack("<I", 99)), "array of value type 99"),
])
def test_what_is_not_a_gguf_header_is_refused_with_the_reason(tmp_path, name, edit, words):
    path = _damaged(tmp_path, name.replace(" ", "-") + ".gguf", edit)
    with pytest.raises(GGUFFormatError, match=words) as e:
        GGUFFile(path)
    assert isinstance(e.value, GGUFStringError) == (name == "bad utf-8")


def _vm_flags_of(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds address (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_resident_dense_tensors_are_the_files_bytes_on_huge_page_memory(tiny35_model):
    """load_resident copies every dense tensor into anonymous memory advised onto huge pages
    (a decode streams them: 4 KiB pages cost the products 13-18 % here), cache-line aligned, with
    the file's bytes; the expert tensors stay views of the file."""
    if not hasattr(__import__("mmap"), "MADV_HUGEPAGE") or not os.path.exists("/sys/kernel/mm/transparent_hugepage"):
        pytest.skip("this kernel has no transparent huge pages")
    mapped = GGUFModel(tiny35_model)
    gm = GGUFModel(tiny35_model)
    gm.load_resident()
    dense = [n for n in gm.tensors if "_exps." not in n]
    assert dense and any("_exps." in n for n in gm.tensors)
    for name in dense:
        data = gm.tensors[name].data
        assert np.array_equal(data.view(np.uint8), mapped.tensors[name].data.view(np.uint8)), name
        assert not data.flags.writeable and data.ctypes.data % 64 == 0, name
        assert "hg" in _vm_flags_of(data.ctypes.data), name
    for name in gm.tensors:
        if "_exps." in name:   # still the file's mapping, which nothing advises
            assert "hg" not in _vm_flags_of(gm.tensors[name].data.ctypes.data), name
