"""Llama 4's own checks, beyond its conformance entry: the chunked attention and the
attention temperature against transformers (llama4_chunked: chunk 8, floor_scale 4,
attn_scale 0.5, which llama.cpp 0.3.36 does not read: it hard-codes 8192, 8192 and 0.1),
the chunk cache, and its hostile metadata refused by name.

The conformance entry (tests/conformance_table.py) checks the `llama4` fixture, at
llama.cpp's constants, against both references; here llama4_chunked's HF directory is
checked against transformers, and its converted GGUF (which carries none of those
settings) against llama.cpp, which runs it at its constants as frink does.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conformance_table import Off, switched_off
from model_checks import REF_TOL, _compare
from safetensors.numpy import load_file, save_file
from script_loader import load_script

import frink_cli
from frink_cli.cache import AttentionKv, ChunkKv
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError

CHUNKED = "llama4_chunked"
CHUNK = 8
FAR = 0.1  # a decoration switched off moves the logits at least this far


@pytest.fixture(scope="module")
def chunked(tiny_model: Callable) -> tuple[frink_cli.Model, dict[str, np.ndarray]]:
    tm = tiny_model(CHUNKED)
    return frink_cli.load(tm.hf_dir), tm.ref


@pytest.mark.parametrize("step", [False, True], ids=["batch", "step"])
@pytest.mark.parametrize("backend", ["numpy", "metal"])
def test_chunked_hf_dir_matches_transformers(
    tiny_model: Callable, backend: str, step: bool
) -> None:
    """Five chunks of 8 and temperatures up to 2.2: transformers' logits, batch and step,
    on the host body and on metal (every layer on the device)."""
    if backend == "metal":
        pytest.importorskip("mlx.core")
    tm = tiny_model(CHUNKED)
    m = frink_cli.load(tm.hf_dir, backend=backend)
    tokens = [int(t) for t in tm.ref["tokens"]]
    assert len(tokens) > 2 * CHUNK
    got = np.asarray(m.logits(tokens, step=step), dtype=np.float32)
    _compare(got, tm.ref["logits_hf"], REF_TOL, f"{CHUNKED} {backend} {step=} vs transformers")
    if backend == "metal":
        ledger = m.decoder.backend.ledger
        assert not ledger.refusals and not ledger.failures, (ledger.refusals, ledger.failures)


def test_chunked_gguf_runs_at_llamacpps_constants(tiny_model: Callable) -> None:
    """The converter writes no chunk or temperature keys: frink then runs the model as
    llama.cpp does (chunk 8192, floor_scale 8192), and matches llama.cpp, not
    transformers."""
    tm = tiny_model(CHUNKED)
    assert tm.gguf is not None
    got = frink_cli.load(tm.gguf).logits([int(t) for t in tm.ref["tokens"]])
    _compare(got, tm.ref["logits_llamacpp"], REF_TOL, f"{CHUNKED} gguf vs llama.cpp")


@pytest.mark.parametrize(
    "off",
    [
        Off("chunked_attention", CHUNKED, {"chunk": None}),
        Off("temperature", CHUNKED, {"temperature": None}),
    ],
    ids=lambda off: off.name,
)
def test_chunk_and_temperature_move_the_logits(chunked: tuple, off: Off) -> None:
    m, ref = chunked
    dec = Decoder(*switched_off(m.config, m.decoder.host.w, off))
    tokens = np.asarray(ref["tokens"])
    got = dec.step(tokens, dec.new_cache(len(tokens)), all_logits=True)
    assert float(np.abs(got - ref["logits_hf"]).max()) > FAR, off.name


def test_chunk_cache_keeps_the_current_chunk(chunked: tuple) -> None:
    """The rope layers' slots hold the current chunk (and the last row of the one before),
    the NoPE layer's every row; stepping back into a dropped chunk is refused by name."""
    m, ref = chunked
    dec = m.decoder
    tokens = np.asarray(ref["tokens"])
    cache = dec.new_cache(len(tokens))
    for t in tokens[:-1]:  # one at a time: the slots trim at every commit
        dec.step(np.asarray([t]), cache)
    n = len(tokens) - 1
    for layer in range(3):
        slot = cache.slot(layer)
        assert isinstance(slot, ChunkKv)
        first, k, _ = slot.held()
        assert first == (n - 1) // CHUNK * CHUNK and k.shape[1] == n - first
    nope = cache.slot(3)
    assert type(nope) is AttentionKv and nope.held()[0] == 0
    with pytest.raises(FrinkError, match="attention chunk of 8 holds positions"):
        cache.truncate(n - CHUNK - 2)
    cache.truncate(n - 1)  # one step back stays possible
    # The last token again, over the trimmed cache: the reference's last row.
    got = dec.step(tokens[-2:], cache, all_logits=True)
    _compare(got, ref["logits_hf"][-2:], REF_TOL, "after a step back")


def test_sequences_in_different_chunks_batched(chunked: tuple) -> None:
    """Two sequences decoded in one step, at positions 13 and 21 (chunks 1 and 2): each
    row attends within its own sequence's chunk."""
    m, ref = chunked
    dec = m.decoder
    tokens = np.asarray(ref["tokens"])
    a, b = dec.new_cache(len(tokens)), dec.new_cache(len(tokens))
    dec.step(tokens[:13], a)
    dec.step(tokens[:21], b)
    got = dec.step_batch([(tokens[13:14], a), (tokens[21:22], b)])
    _compare(got, ref["logits_hf"][[13, 21]], REF_TOL, "two sequences in one step")


def test_chunk_slot_after_a_long_prefill_and_many_decode_steps() -> None:
    """On its own: after a batch of 300 rows and 1000 decode steps the slot holds the
    current chunk (and the previous chunk's last row), the same rows as a full slot, and a
    step that fails leaves it as it was."""
    rng = np.random.default_rng(0)

    def rows(n: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.standard_normal((n, 2, 4), np.float32), rng.standard_normal(
            (n, 2, 4), np.float32
        )

    slot, full = ChunkKv(2, 4, 4, 4096, CHUNK), AttentionKv(2, 4, 4, 4096)
    k, v = rows(300)
    for s in (slot, full):
        assert s.append(k, v)[0] == 0
        s.commit(300)
    for n in range(301, 1301):
        k, v = rows(1)
        first = slot.append(k, v)[0]
        assert first <= (n - 1) // CHUNK * CHUNK  # every key the new query sees is there
        full.append(k, v)
        slot.commit(n)
        full.commit(n)
        assert slot.held()[0] == (n - 1) // CHUNK * CHUNK
    first, K, V = slot.held()
    _, fk, fv = full.held()
    np.testing.assert_array_equal(K, fk[:, first:])
    np.testing.assert_array_equal(V, fv[:, first:])
    assert slot._k.shape[1] <= CHUNK + 128  # the buffer shrank back after the long batch
    slot.rollback()
    slot.reserve(1300 + 500)
    slot.append(*rows(500))
    slot.rollback()
    assert slot.held()[0] == first and slot.n_past == 1300
    np.testing.assert_array_equal(slot.held()[1], K)


_FUZZ = load_script("fuzz_inputs")
_NAMED = {
    "llama4_chunk_zero": "llama4.attention.chunk_size = 0",
    "llama4_chunk_huge": "llama4.attention.chunk_size = 4294967295",
    "llama4_no_chunks": "llama4.attention.sliding_window = 0",
    "llama4_moe_step_zero": "llama4.interleave_moe_layer_step = 0",
    "llama4_moe_step_huge": "llama4.interleave_moe_layer_step = 4294967295",
    "llama4_nope_step_zero": "llama4.no_rope_layer_step = 0",
    "llama4_nope_step_huge": "llama4.no_rope_layer_step = 4294967295",
    "llama4_floor_zero": "llama4.attention.temperature_floor_scale = 0.0",
    "llama4_temp_nan": "llama4.attention.temperature_scale = nan",
}


@pytest.mark.parametrize("case", sorted(_NAMED))
def test_hostile_metadata_refused_by_name(tmp_path: Path, case: str) -> None:
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(_FUZZ.llama4_ggufs()[case].encode())
    with pytest.raises(FrinkError, match=_NAMED[case].replace(".", r"\.")):
        frink_cli.load(path)


def test_the_fuzz_base_runs(tmp_path: Path) -> None:
    path = tmp_path / "valid.gguf"
    path.write_bytes(_FUZZ.llama4_ggufs()["llama4_valid"].encode())
    assert frink_cli.load(path).logits([1, 2, 3]).shape[0] == 3


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"moe_layers": [0]}, "moe_layers does not follow interleave_moe_layer_step 2"),
        (
            {"no_rope_layers": [1, 0, 1, 1]},
            "no_rope_layers does not follow no_rope_layer_interval 4",
        ),
        ({"attention_chunk_size": None}, "without attention_chunk_size"),
    ],
)
def test_hf_configs_llamacpp_has_no_graph_for_are_refused(
    tiny_model: Callable, tmp_path: Path, change: dict, match: str
) -> None:
    hf = Path(shutil.copytree(tiny_model(CHUNKED).hf_dir, tmp_path / "hf"))
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps(dict(cfg, **change)))
    with pytest.raises(FrinkError, match=match):
        frink_cli.load(hf)


def test_multimodal_checkpoint_reads_its_language_model(
    tiny_model: Callable, tmp_path: Path
) -> None:
    """HF model_type llama4 (Llama4ForConditionalGeneration, as Llama 4 is released): the
    text config under text_config, the weights under language_model., the vision model
    ignored; the same logits as the text model's."""
    tm = tiny_model("llama4")
    hf = Path(shutil.copytree(tm.hf_dir, tmp_path / "hf"))
    text = json.loads((hf / "config.json").read_text())
    text.pop("architectures", None)
    cfg = {
        "model_type": "llama4",
        "architectures": ["Llama4ForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"hidden_size": 32},
    }
    (hf / "config.json").write_text(json.dumps(cfg))
    for f in hf.glob("*.safetensors"):
        weights = {"language_model." + k: v for k, v in load_file(f).items()}
        weights["vision_model.patch_embedding.weight"] = np.zeros((2, 2), np.float32)
        save_file(weights, str(f), metadata={"format": "pt"})
    got = frink_cli.load(hf).logits([int(t) for t in tm.ref["tokens"]])
    _compare(got, tm.ref["logits_hf"], REF_TOL, "llama4 multimodal checkpoint vs transformers")
