"""The safetensors reader against llama.cpp's converter: same Checkpoint from both files.

Why: frink holds every model in GGUF's names, layouts and metadata keys, and reaches that
form from a Hugging Face directory by re-doing the converter's work (renames, Q/K row
permutation, +1 on Gemma norms, rope keys). The reference is the converter itself: each
tiny random model is opened as its HF directory and as the GGUF llama.cpp's converter made
of it, and the two must agree tensor for tensor and key for key. Where frink carries what
the converter drops (Gemma 3's per-layer window pattern and query scale), the reference is
transformers' own reading of the same config.json.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from script_loader import load_script

from frink_cli.archs import open_checkpoint, read_hf_dir
from frink_cli.errors import FrinkError
from frink_cli.formats import Checkpoint

# --- helpers ------------------------------------------------------------------------------


def _converter() -> ModuleType:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return load_script("llama_cpp_converter")


def _descriptive(key: str) -> bool:
    # general.* (name, size label, file type...) and tokenizer.* describe the file, not
    # the model's arithmetic; the random fixtures have no tokenizer anyway.
    return key != "general.architecture" and key.startswith(("general.", "tokenizer."))


def _same_value(mine: Any, theirs: Any) -> bool:
    if isinstance(theirs, float):
        # GGUF stores float32; frink rounds its floats the same way.
        return isinstance(mine, float) and np.float32(mine) == np.float32(theirs)
    if isinstance(theirs, np.ndarray):
        return np.array_equal(np.asarray(mine), theirs)
    return type(mine) is type(theirs) and mine == theirs


def assert_same_checkpoint(
    hf: Checkpoint, gg: Checkpoint, skip_keys: frozenset[str] = frozenset()
) -> None:
    """Identical tensor names, shapes and values; every model key of the GGUF equal."""
    assert hf.format == "safetensors" and gg.format == "gguf"
    hf_names, gg_names = set(hf.tensors.names()), set(gg.tensors.names())
    assert hf_names == gg_names, (
        f"only in HF dir: {sorted(hf_names - gg_names)}; "
        f"only in GGUF: {sorted(gg_names - hf_names)}"
    )
    for name in sorted(gg_names):
        info = hf.tensors.info(name)
        assert info.shape == gg.tensors.info(name).shape, name
        assert info.dtype in ("F32", "F16", "BF16"), (name, info.dtype)
        mine, theirs = hf.tensors.load(name), gg.tensors.load(name)
        assert mine.dtype == np.float32 and mine.shape == info.shape, name
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-6, err_msg=name)
    keys = [k for k in gg.metadata if not _descriptive(k) and k not in skip_keys]
    assert keys, "the GGUF has no model keys?"
    wrong = {
        k: (hf.metadata.get(k), gg.metadata[k])
        for k in keys
        if not _same_value(hf.metadata.get(k), gg.metadata[k])
    }
    assert not wrong, f"metadata (frink, converter): {wrong}"


def _copy_hf(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(hf_dir: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = hf_dir / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg, indent=2))


def _recast(hf_dir: Path, dtype_name: str) -> None:
    """Rewrite model.safetensors with every tensor in torch dtype `dtype_name`."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    path = hf_dir / "model.safetensors"
    tensors = load_file(str(path))
    save_file(
        {k: v.to(getattr(torch, dtype_name)).contiguous() for k, v in tensors.items()},
        str(path),
        metadata={"format": "pt"},
    )


def _convert(hf_dir: Path, out: Path) -> Checkpoint:
    _converter().convert(hf_dir, out, outtype="f32")
    return open_checkpoint(out)


# --- the converter as reference -------------------------------------------------------------


def test_matches_converted_gguf(tiny_model: Callable, tiny_name: str) -> None:
    tm = tiny_model(tiny_name)
    if tm.gguf is None:
        pytest.skip(f"{tiny_name}: llama.cpp's converter made no text GGUF of it")
    hf = open_checkpoint(tm.hf_dir)
    assert hf.hf_dir == tm.hf_dir and hf.path == tm.hf_dir
    assert_same_checkpoint(hf, open_checkpoint(tm.gguf))


@pytest.mark.parametrize(
    ("base", "dtype"), [("llama", "bfloat16"), ("llama", "float16"), ("gemma3_text", "bfloat16")]
)
def test_half_precision_sources(
    tiny_model: Callable, tmp_path: Path, base: str, dtype: str
) -> None:
    # bf16 is widened by bit shifting (numpy has no bf16); the converter upcasts bf16 with
    # torch before its own transforms, so even Gemma's +1 must match bit for bit.
    # (Not f16 Gemma: the converter adds Gemma's +1 in f16, frink in f32 like transformers.)
    hf_dir = _copy_hf(tiny_model(base).hf_dir, tmp_path / "hf")
    _recast(hf_dir, dtype)
    hf = read_hf_dir(hf_dir)
    want = {"bfloat16": "BF16", "float16": "F16"}[dtype]
    assert {hf.tensors.info(n).dtype for n in hf.tensors.names()} == {want}
    assert_same_checkpoint(hf, _convert(hf_dir, tmp_path / "model.gguf"))


def _llama3_rope(cfg: dict[str, Any]) -> None:
    cfg.pop("rope_theta", None)
    cfg["rope_parameters"] = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }


def _qwen2_legacy_yarn(cfg: dict[str, Any]) -> None:
    # A transformers-4 style config: rope_theta at the top, rope_scaling with "type".
    theta = cfg.pop("rope_parameters", {}).get("rope_theta", 10000.0)
    cfg["rope_theta"] = theta
    cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


def _gemma3_legacy_linear(cfg: dict[str, Any]) -> None:
    # As Google's Gemma 3 configs were written before transformers 5: no layer_types, a
    # period pattern, rope_local_base_freq, linear scaling for the global layers only.
    rp = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    cfg.pop("_sliding_window_pattern", None)
    cfg["sliding_window_pattern"] = 6
    cfg["rope_theta"] = rp["full_attention"]["rope_theta"]
    cfg["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"]
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    cfg["final_logit_softcapping"] = 30.0


@pytest.mark.parametrize(
    ("base", "edit", "expect"),
    [
        ("llama", _llama3_rope, {"rope_freqs.weight"}),
        (
            "qwen2",
            _qwen2_legacy_yarn,
            {
                "qwen2.rope.scaling.type",
                "qwen2.rope.scaling.factor",
                "qwen2.rope.scaling.original_context_length",
            },
        ),
        (
            "gemma3_text",
            _gemma3_legacy_linear,
            {"gemma3.rope.scaling.factor", "gemma3.final_logit_softcapping"},
        ),
    ],
    ids=["llama3-rope", "qwen2-legacy-yarn", "gemma3-legacy-linear"],
)
def test_config_variants(
    tiny_model: Callable, tmp_path: Path, base: str, edit: Callable, expect: set[str]
) -> None:
    hf_dir = _copy_hf(tiny_model(base).hf_dir, tmp_path / "hf")
    _edit_config(hf_dir, edit)
    hf, gg = read_hf_dir(hf_dir), _convert(hf_dir, tmp_path / "model.gguf")
    # The variant really exercises something: what it adds is in the converter's output.
    assert expect <= set(gg.metadata) | set(gg.tensors.names())
    assert_same_checkpoint(hf, gg)


def test_gemma3_embedding_trimmed_to_tokenizer(tiny_model: Callable, tmp_path: Path) -> None:
    # The converter drops token_embd rows past the tokenizer's vocab (Gemma 3 pads its
    # embedding); with only tokenizer.json it keeps len(vocab) + len(added_tokens).
    hf_dir = _copy_hf(tiny_model("gemma3_text").hf_dir, tmp_path / "hf")
    vocab = {f"t{i}": i for i in range(480)}
    added = [{"id": 480 + i, "content": f"<x{i}>", "special": True} for i in range(8)]
    (hf_dir / "tokenizer.json").write_text(
        json.dumps({"model": {"vocab": vocab}, "added_tokens": added})
    )
    hf, gg = read_hf_dir(hf_dir), _convert(hf_dir, tmp_path / "model.gguf")
    assert hf.tensors.info("token_embd.weight").shape == (488, 64)
    assert hf.metadata["gemma3.vocab_size"] == 488
    # The wrapper around the converter writes vocab_size from config.json (a random model
    # has no token list); the converter proper writes none for gemma3.
    assert_same_checkpoint(hf, gg, skip_keys=frozenset({"gemma3.vocab_size"}))


# --- what the converter does not carry: transformers' reading of the config ----------------


@pytest.mark.parametrize("name", ["gemma3_text", "gemma3"])
def test_gemma3_layer_pattern_and_scale_follow_transformers(
    tiny_model: Callable, name: str
) -> None:
    transformers = pytest.importorskip("transformers")
    hf_dir = tiny_model(name).hf_dir
    ref = transformers.AutoConfig.from_pretrained(hf_dir)
    ref = getattr(ref, "text_config", None) or ref
    meta = read_hf_dir(hf_dir).metadata
    assert meta["gemma3.attention.sliding_window_pattern"] == [
        t == "sliding_attention" for t in ref.layer_types
    ]
    assert meta["gemma3.attention.sliding_window"] == ref.sliding_window
    assert meta["gemma3.attention.scale"] == pytest.approx(
        ref.query_pre_attn_scalar**-0.5, rel=1e-7
    )
    assert (
        meta["gemma3.rope.freq_base_swa"] == ref.rope_parameters["sliding_attention"]["rope_theta"]
    )


def test_gemma3_legacy_pattern_follows_transformers(tiny_model: Callable, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf_dir = _copy_hf(tiny_model("gemma3_text").hf_dir, tmp_path / "hf")

    def legacy(cfg: dict[str, Any]) -> None:
        _gemma3_legacy_linear(cfg)
        cfg["sliding_window_pattern"] = 3  # not llama.cpp's hard-coded 6
        cfg["query_pre_attn_scalar"] = 50

    _edit_config(hf_dir, legacy)
    ref = transformers.AutoConfig.from_pretrained(hf_dir)
    meta = read_hf_dir(hf_dir).metadata
    want = [t == "sliding_attention" for t in ref.layer_types]
    assert want != [(i + 1) % 6 != 0 for i in range(len(want))]  # the case is a real one
    assert meta["gemma3.attention.sliding_window_pattern"] == want
    assert meta["gemma3.attention.scale"] == pytest.approx(50**-0.5, rel=1e-7)


def test_multimodal_gemma3_notes_ignored_vision(tiny_model: Callable) -> None:
    ck = read_hf_dir(tiny_model("gemma3").hf_dir)
    assert ck.arch == "gemma3"
    assert any("vision" in n for n in ck.notes)
    assert not any("vision" in n or "mm_" in n for n in ck.tensors.names())


def test_tied_model_with_stray_lm_head_has_no_output(tiny_model: Callable, tmp_path: Path) -> None:
    # GGUF says "tied" by having no output.weight; an exporter that saved lm_head anyway
    # must not make frink treat the model as untied.
    from safetensors.numpy import load_file, save_file

    hf_dir = _copy_hf(tiny_model("llama_tied").hf_dir, tmp_path / "hf")
    path = hf_dir / "model.safetensors"
    tensors = load_file(str(path))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    save_file(tensors, str(path))
    ck = read_hf_dir(hf_dir)
    assert "output.weight" not in ck.tensors.names()
    assert any("tie_word_embeddings" in n for n in ck.notes)


# --- sharded directories ----------------------------------------------------------------------


def _shard(hf_dir: Path, n_shards: int = 3) -> list[str]:
    """Split model.safetensors into n shards plus an index, as save_pretrained does."""
    from safetensors.numpy import load_file, save_file

    single = hf_dir / "model.safetensors"
    tensors = load_file(str(single))
    single.unlink()
    names = sorted(tensors)
    files, weight_map = [], {}
    for i in range(n_shards):
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {k: tensors[k] for k in names[i::n_shards]}
        save_file(part, str(hf_dir / fname))
        weight_map.update({k: fname for k in part})
        files.append(fname)
    (hf_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    return files


def test_sharded_directory(tiny_model: Callable, tmp_path: Path) -> None:
    tm = tiny_model("qwen3")
    hf_dir = _copy_hf(tm.hf_dir, tmp_path / "hf")
    _shard(hf_dir)
    assert_same_checkpoint(read_hf_dir(hf_dir), open_checkpoint(tm.gguf))


def test_missing_shard_names_it(tiny_model: Callable, tmp_path: Path) -> None:
    hf_dir = _copy_hf(tiny_model("qwen3").hf_dir, tmp_path / "hf")
    files = _shard(hf_dir)
    (hf_dir / files[1]).unlink()
    with pytest.raises(FrinkError, match=files[1]):
        read_hf_dir(hf_dir)


def test_tensor_absent_from_its_shard(tiny_model: Callable, tmp_path: Path) -> None:
    hf_dir = _copy_hf(tiny_model("qwen3").hf_dir, tmp_path / "hf")
    _shard(hf_dir)
    index = hf_dir / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.layers.9.mlp.up_proj.weight"] = next(
        iter(data["weight_map"].values())
    )
    index.write_text(json.dumps(data))
    with pytest.raises(FrinkError, match="model.layers.9.mlp.up_proj.weight"):
        read_hf_dir(hf_dir)


# --- bad input --------------------------------------------------------------------------------


@pytest.fixture
def llama_copy(tiny_model: Callable, tmp_path: Path) -> Path:
    return _copy_hf(tiny_model("llama").hf_dir, tmp_path / "hf")


@pytest.mark.parametrize("cut", ["in_data", "in_header", "no_header"])
def test_truncated_file_names_it(llama_copy: Path, cut: str) -> None:
    path = llama_copy / "model.safetensors"
    raw = path.read_bytes()
    (n_header,) = struct.unpack("<Q", raw[:8])
    keep = {"in_data": len(raw) - 100, "in_header": 8 + n_header // 2, "no_header": 5}[cut]
    path.write_bytes(raw[:keep])
    with pytest.raises(FrinkError, match="model.safetensors") as err:
        open_checkpoint(llama_copy)
    assert "truncated" in str(err.value)


def test_corrupt_header(llama_copy: Path) -> None:
    path = llama_copy / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[8:20] = b"\xff" * 12  # no longer JSON
    path.write_bytes(bytes(raw))
    with pytest.raises(FrinkError, match="model.safetensors"):
        read_hf_dir(llama_copy)


def test_offsets_past_end_of_file(llama_copy: Path) -> None:
    # A header that promises more data than the file holds, with the file otherwise intact.
    path = llama_copy / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 10**6, end + 10**6]
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n :])
    with pytest.raises(FrinkError, match=name.replace(".", r"\.")):
        read_hf_dir(llama_copy)


def test_unknown_model_type(llama_copy: Path) -> None:
    _edit_config(llama_copy, lambda c: c.update(model_type="gpt_neox"))
    with pytest.raises(FrinkError, match="unsupported architecture.*gpt_neox"):
        open_checkpoint(llama_copy)


def test_missing_config(llama_copy: Path) -> None:
    (llama_copy / "config.json").unlink()
    with pytest.raises(FrinkError, match="config.json"):
        read_hf_dir(llama_copy)


def test_no_weights(llama_copy: Path) -> None:
    (llama_copy / "model.safetensors").unlink()
    with pytest.raises(FrinkError, match="model.safetensors"):
        read_hf_dir(llama_copy)


def test_unsupported_dtype_and_unknown_tensor(llama_copy: Path) -> None:
    from safetensors.numpy import load_file, save_file

    path = llama_copy / "model.safetensors"
    tensors = load_file(str(path))
    save_file(
        {**tensors, "model.layers.0.mlp.up_proj.weight": np.zeros((128, 64), np.int8)}, str(path)
    )
    with pytest.raises(FrinkError, match="up_proj.*I8"):
        read_hf_dir(llama_copy)
    save_file({**tensors, "model.layers.0.mystery.weight": np.zeros(3, np.float32)}, str(path))
    with pytest.raises(FrinkError, match="mystery"):
        read_hf_dir(llama_copy)


def test_unknown_tensor_name_is_refused(llama_copy: Path) -> None:
    ck = read_hf_dir(llama_copy)
    with pytest.raises(FrinkError, match="blk.99.attn_q.weight"):
        ck.tensors.load("blk.99.attn_q.weight")
