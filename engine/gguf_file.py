"""A GGUF file's header, parsed straight from its bytes: metadata, tensor infos, where the
tensor data starts.

gguf-py's GGUFReader keeps a NumPy view for every value and every string of every array:
on the production model's 248,320-token vocabulary (and as many merges) that is 9.5 s and
850 MB of RSS on every engine start, memory the arena then lacks. This reads the same
header in one pass with `struct`: scalars and strings as Python values, numeric arrays as
one NumPy array each, string arrays as lists of str.

Layout (little-endian; versions 2 and 3): magic "GGUF", uint32 version, uint64 tensor
count, uint64 metadata count; each key/value: string key, uint32 type, value (a string is
uint64 length + UTF-8 bytes; an array is uint32 item type, uint64 count, items); each
tensor info: string name, uint32 n_dims, uint64 dims[n_dims] (fastest first), uint32 ggml
type, uint64 offset relative to the data section, which starts at the next multiple of
general.alignment (default 32) after the infos.

Anything that does not parse is a GGUFFormatError naming what and where.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"GGUF"
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)   # Linux 5.14; Python 3.11 lacks the name
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
TYPE_NAMES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
              "UINT64", "INT64", "FLOAT64")
SCALARS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
           BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF header this parser can read."""


class GGUFStringError(GGUFFormatError):
    """A metadata string that is not UTF-8: `where` is the key, with [index] inside an array."""

    def __init__(self, where: str, err: UnicodeDecodeError):
        self.where, self.reason, self.start = where, err.reason, err.start
        super().__init__(f"metadata {where} is not valid UTF-8 ({err.reason} at byte {err.start})")


@dataclass(frozen=True)
class Field:
    type: int                # GGUF value type
    item_type: int | None    # an array's item type (None: not an array)
    value: object            # int | float | bool | str | list[str] | np.ndarray (numeric array)

    def is_array_of(self, item_type: int) -> bool:
        return self.type == ARRAY and self.item_type == item_type

    def contents(self):
        """The value as Python data (a numeric array as a list)."""
        return self.value.tolist() if isinstance(self.value, np.ndarray) else self.value


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]   # ggml order, fastest dimension first
    ggml_type: int
    offset: int              # relative to the data section


class GGUFFile:
    """The parsed header of `path` and a read-only map of the whole file (`data`)."""

    def __init__(self, path: str | os.PathLike):
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.data = np.frombuffer(self._map, dtype=np.uint8)
        self._pos = 0
        self.fields: dict[str, Field] = {}
        self.tensors: list[TensorInfo] = []
        self._parse()

    def map_cached(self, start: int, end: int) -> bool:
        """Map bytes start..end of the file into this process's page tables now
        (MADV_POPULATE_READ), if every page of them is in the page cache already (mincore):
        then it reads nothing from disk and takes no memory the pages do not hold already --
        it only moves the page faults of a first pass out of it. Otherwise, or on a kernel
        without it (Linux < 5.14), nothing happens. True when mapped."""
        page = mmap.PAGESIZE
        start -= start % page
        end = min(len(self._map), end)
        n_pages = (end - start + page - 1) // page
        if n_pages <= 0:
            return False
        base = self.data.ctypes.data
        vec = np.zeros(n_pages, np.uint8)
        if _libc.mincore(ctypes.c_void_p(base + start), ctypes.c_size_t(end - start),
                         vec.ctypes.data_as(ctypes.c_char_p)) != 0 or not (vec & 1).all():
            return False
        try:
            self._map.madvise(MADV_POPULATE_READ, start, end - start)
        except OSError:
            return False
        return True

    # ------------------------------------------------------------------ primitives

    def _take(self, n: int, what: str) -> int:
        """Advance over `n` bytes; the offset where they start."""
        at = self._pos
        if n < 0 or at + n > len(self._map):
            raise GGUFFormatError(f"truncated: {what} at byte {at} needs {n} bytes, the file has {len(self._map) - at}")
        self._pos = at + n
        return at

    def _unpack(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self._map, self._take(struct.calcsize(fmt), what))[0]

    def _string(self, what: str) -> str:
        n = self._unpack("<Q", what)
        at = self._take(n, what)
        try:
            return self._map[at:at + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFStringError(what, e) from None

    # ------------------------------------------------------------------ structure

    def _parse(self) -> None:
        if self._map[self._take(4, "magic"):4] != MAGIC:
            raise GGUFFormatError("bad magic")
        version = self._unpack("<I", "version")
        if version not in VERSIONS:
            raise GGUFFormatError(f"GGUF version {version} (this reads {' and '.join(map(str, VERSIONS))})")
        n_tensors, n_kv = self._unpack("<Q", "tensor count"), self._unpack("<Q", "metadata count")
        for _ in range(n_kv):
            key = self._string("a metadata key")
            if key in self.fields:
                raise GGUFFormatError(f"metadata key {key} appears twice")
            self.fields[key] = self._value(key)
        names = set()
        for i in range(n_tensors):
            name = self._string(f"tensor info {i}")
            n_dims = self._unpack("<I", f"tensor {name}")
            if n_dims > 4:
                raise GGUFFormatError(f"tensor {name} has {n_dims} dimensions (at most 4)")
            at = self._take(8 * n_dims, f"tensor {name}'s dimensions")
            shape = struct.unpack_from(f"<{n_dims}Q", self._map, at)
            ggml_type, offset = self._unpack("<I", f"tensor {name}"), self._unpack("<Q", f"tensor {name}")
            if name in names:
                raise GGUFFormatError(f"tensor {name} appears twice")
            names.add(name)
            self.tensors.append(TensorInfo(name, tuple(int(d) for d in shape), ggml_type, offset))
        align = self.fields.get("general.alignment")
        self.alignment = DEFAULT_ALIGNMENT if align is None else align.value
        if align is not None and (align.type != UINT32 or self.alignment <= 0 or self.alignment & (self.alignment - 1)):
            raise GGUFFormatError(f"general.alignment {self.alignment!r} is not a power of two (uint32)")
        self.data_offset = -(-self._pos // self.alignment) * self.alignment

    def _value(self, key: str) -> Field:
        vtype = self._unpack("<I", f"metadata {key}'s type")
        if vtype == ARRAY:
            itype, count = self._unpack("<I", f"metadata {key}'s item type"), self._unpack("<Q", f"metadata {key}")
            if itype == STRING:
                return Field(ARRAY, STRING, [self._string(f"{key}[{i}]") for i in range(count)])
            if itype not in SCALARS:
                raise GGUFFormatError(f"metadata {key}: array of value type {itype}")
            fmt = SCALARS[itype]
            at = self._take(count * struct.calcsize(fmt), f"metadata {key}'s {count} items")
            return Field(ARRAY, itype, np.frombuffer(self._map, np.dtype(fmt), count, at).copy())
        if vtype == STRING:
            return Field(STRING, None, self._string(key))
        if vtype not in SCALARS:
            raise GGUFFormatError(f"metadata {key}: value type {vtype}")
        return Field(vtype, None, self._unpack(SCALARS[vtype], f"metadata {key}"))
