"""A copy of a GGUF with one integer metadata value changed in place (same size, same layout):
e.g. another end-of-generation token, so the contract suite can make any model end a
generation where it wants."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

from gguf import GGUFReader, GGUFValueType

from ..errors import InputError

INT_FORMATS = {GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.UINT64: "<Q",
               GGUFValueType.INT64: "<q", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h"}


def with_int_value(src: str | os.PathLike, dst: str | os.PathLike, key: str, value: int) -> Path:
    r = GGUFReader(src)
    field = r.get_field(key)
    if field is None or len(field.types) != 1 or field.types[0] not in INT_FORMATS:
        raise InputError(src, f"metadata {key} is not an integer scalar")
    part = field.parts[field.data[0]]
    offset = part.ctypes.data - r.data.ctypes.data          # the value's bytes in the file
    fmt = INT_FORMATS[field.types[0]]
    del r, field, part                                      # the memory map, before the copy is written
    dst = Path(dst)
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(fmt, value))
    return dst
