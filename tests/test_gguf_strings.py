"""A GGUF file's arrays of strings (a vocabulary's tokens and merges) as frink reads them,
against gguf-py's reader of the same file, and the one line a bad element gets.

Why: the reader takes an array's strings in one loop (formats/gguf.py `_Cursor.strings`:
150k tokens and as many merges are most of opening a model); an element that runs past the
end of the file or is not UTF-8 must still be refused by its index, as one call per string
refused it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from fixture_copies import write_out
from gguf import GGUFReader, GGUFWriter

from frink_cli.errors import FrinkError
from frink_cli.formats.gguf import read_gguf

KEY = "frink.test.strings"
STRINGS = ["a", "", "Ġthe", "é", "日本語", " x y", "<0x0A>", "a" * 300]


def _write(path: Path, strings: list[str]) -> Path:
    writer = GGUFWriter(path, "llama")
    writer.add_array(KEY, strings)
    writer.add_tensor("w", np.zeros(4, np.float32))
    write_out(writer)
    return path


def _element_offset(path: Path, i: int) -> int:
    """The byte offset of element i's length field (gguf-py's parse of the file)."""
    field = GGUFReader(path).fields[KEY]
    # parts: key length, key, value type, element type, count, then length, bytes per string
    return int(field.offset) + sum(p.nbytes for p in field.parts[: 5 + 2 * i])


def test_string_arrays_read_as_gguf_py_reads_them(tmp_path: Path) -> None:
    path = _write(tmp_path / "ok.gguf", STRINGS)
    field = GGUFReader(path).fields[KEY]
    theirs = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    assert theirs == STRINGS
    assert read_gguf(path).metadata[KEY] == theirs


def test_a_string_that_is_not_utf8_is_refused_by_its_index(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.gguf", STRINGS)
    at = _element_offset(path, 3)  # "é": two bytes, the second made a lone lead byte
    raw = bytearray(path.read_bytes())
    assert struct.unpack_from("<Q", raw, at)[0] == 2
    raw[at + 8 + 1] = 0xC3
    path.write_bytes(bytes(raw))
    with pytest.raises(FrinkError, match=rf"{KEY}'\[3\] is not valid UTF-8"):
        read_gguf(path)


def test_a_string_past_the_end_of_the_file_is_refused_by_its_index(tmp_path: Path) -> None:
    path = _write(tmp_path / "long.gguf", STRINGS)
    at = _element_offset(path, 5)
    raw = bytearray(path.read_bytes())
    raw[at : at + 8] = struct.pack("<Q", len(raw))  # element 5 claims more than the file
    path.write_bytes(bytes(raw))
    with pytest.raises(
        FrinkError, match=rf"truncated or corrupt GGUF file \(metadata '{KEY}'\[5\]"
    ):
        read_gguf(path)
