#!/usr/bin/env python3
"""Write an all-F32 copy of a GGUF file, with gguf-py's own reader and dequantizer.

Why: on a quantized file llama.cpp multiplies by activations it has rounded to 8 bits
(Q8_0/Q8_1/Q8_K), so its logits differ from an f32 evaluation of the same weights by
up to ~1 logit and greedy text can flip at near-ties. An F32 copy holds exactly the real
model's weights and makes llama.cpp evaluate them in f32, so frink can be held to
llama.cpp's answers at tight tolerances on a real model, tokenizer and vocabulary.
Independent of frink on purpose: only gguf-py touches the bytes.

    python scripts/dequantize_gguf.py SRC.gguf DST.gguf
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize


def copy_fields(reader: GGUFReader, writer: GGUFWriter, keep: Callable[[str], bool]) -> None:
    """The reader's key-value fields whose keys `keep` accepts, written as they are."""
    for key, field in reader.fields.items():
        if not keep(key):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), vtype, sub_type=field.types[1])
        else:
            writer.add_key_value(key, field.contents(), vtype)


def finish(writer: GGUFWriter, tmp: Path, dst: Path) -> None:
    """Write out what `writer` (opened on tmp) holds, then move it to dst in one step, so
    dst is never a half-written file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, dst)


def dequantize_file(src: Path, dst: Path) -> None:
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tmp = dst.with_suffix(".tmp")
    writer = GGUFWriter(tmp, arch)
    copy_fields(
        reader,
        writer,
        lambda key: (
            not key.startswith("GGUF.") and key not in ("general.architecture", "general.file_type")
        ),
    )
    writer.add_file_type(0)  # ALL_F32
    for t in reader.tensors:
        data = dequantize(t.data, GGMLQuantizationType(int(t.tensor_type)))
        shape = tuple(int(x) for x in reversed(t.shape))
        writer.add_tensor(t.name, np.ascontiguousarray(data.reshape(shape), dtype=np.float32))
    finish(writer, tmp, dst)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    dequantize_file(Path(sys.argv[1]), Path(sys.argv[2]))
