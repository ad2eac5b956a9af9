"""llama.cpp's own quantizer, run in a child process: a tiny GGUF requantized to one type.

Shared by the quant-type tests (tests/test_quant_types.py, tests/test_q1_0.py): every 2-D
weight forced to the type asked for by a tensor-type override (`pure`; norms stay f32),
with a uniform importance matrix where llama.cpp insists on one; ttype -1 with
ftype ALL_F32 writes llama.cpp's own dequantization of a quantized file. `overrides`
replaces the one catch-all override with (tensor-name regex, type) pairs, tried in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

_QUANTIZE = r"""
import ctypes, json, sys, llama_cpp as L
from gguf import GGUFReader
src, dst = sys.argv[1], sys.argv[2]
ttype, imatrix, ftype = int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
rules = json.loads(sys.argv[6]) or [["weight", ttype]]
cb = L.llama_log_callback(lambda level, text, user_data: None)
L.llama_log_set(cb, None)
L.llama_backend_init()
p = L.llama_model_quantize_default_params()
p.ftype, p.pure, p.nthread, p.allow_requantize = ftype, True, 2, True
keep = []
if ttype >= 0:
    ov = (L.llama_model_tensor_override * (len(rules) + 1))()
    for i, (pattern, t) in enumerate(rules):
        ov[i].pattern, ov[i].type = pattern.encode(), t
    ov[len(rules)].pattern = None
    keep.append(ov)
    p.tt_overrides = ctypes.cast(ov, ctypes.POINTER(L.llama_model_tensor_override))
if imatrix:  # uniform importance: every column of every matrix weighs the same
    ts = GGUFReader(src).tensors
    arr = (L.llama_model_imatrix_data * (len(ts) + 1))()
    for i, t in enumerate(ts):
        n = int(t.shape[0])
        ones = (ctypes.c_float * n)(*([1.0] * n))
        keep.append(ones)
        arr[i].name, arr[i].size = t.name.encode(), n
        arr[i].data = ctypes.cast(ones, ctypes.POINTER(ctypes.c_float))
    arr[len(ts)].name = None
    p.imatrix = ctypes.cast(arr, ctypes.POINTER(L.llama_model_imatrix_data))
sys.exit(L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)))
"""


def llama_quantize(
    src: Path,
    dst: Path,
    ttype: int,
    imatrix: bool,
    ftype: int,
    overrides: Sequence[tuple[str, int]] = (),
) -> None:
    tmp = dst.with_suffix(".tmp")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _QUANTIZE,
            str(src),
            str(tmp),
            str(ttype),
            str(int(imatrix)),
            str(ftype),
            json.dumps([list(rule) for rule in overrides]),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, OMP_NUM_THREADS="2"),
    )
    if proc.returncode != 0:
        pytest.fail(
            f"llama.cpp could not write {dst.name}: {(proc.stdout + proc.stderr)[-2000:]}",
            pytrace=False,
        )
    tmp.replace(dst)


_FTYPE_MOSTLY_Q8_0 = 7  # the base ftype; the override sets every matrix's type
_FTYPE_ALL_F32 = 0


def quantized_with_references(
    src: Path,
    root: Path,
    qtype: str,
    ttype: int,
    imatrix: bool,
    tokens: np.ndarray,
    logits: Callable[[Path, np.ndarray], np.ndarray],
) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """src quantized to one type by llama.cpp, llama.cpp's F32 requant of that file, and
    llama.cpp's logits on both over `tokens` (`logits`: the fixture maker's llama.cpp run):
    (file, F32 file, {"tokens", "quantized", "f32"}), cached under root, which is emptied
    when src's fixture spec or the tokens change."""
    stamp = json.loads((src.parent / "stamp.json").read_text())
    root.mkdir(parents=True, exist_ok=True)
    key = json.dumps({"fixture": stamp["spec"], "tokens": tokens.tolist(), "v": 2})
    if (root / "key.json").is_file() and (root / "key.json").read_text() != key:
        for f in root.iterdir():
            f.unlink()
    (root / "key.json").write_text(key)
    path, f32, npz = (root / f"{qtype}{s}" for s in (".gguf", ".f32.gguf", ".npz"))
    if not path.is_file():
        llama_quantize(src, path, ttype, imatrix, _FTYPE_MOSTLY_Q8_0)
    if not f32.is_file():
        llama_quantize(path, f32, -1, False, _FTYPE_ALL_F32)
    if not npz.is_file():
        np.savez(npz, tokens=tokens, quantized=logits(path, tokens), f32=logits(f32, tokens))
    with np.load(npz) as z:
        return path, f32, {k: z[k] for k in z.files}
