"""The last embedding families against sentence-transformers on the same folders: a tiny
random MPNet (relative position buckets; all-mpnet-base-v2's mean pooling + Normalize)
and a tiny random EmbeddingGemma (Gemma 3 text with bidirectional attention and a
symmetric window; mean pooling, two Dense layers, Normalize), both written by
scripts/make_tiny_encoders.py with sentence-transformers itself. Each decoration switched
off moves the embeddings; `frink embed`, /v1/embeddings and `frink info` on both; hostile
configs refused by name; metal and cuda refuse the layers by name.

MPNet is an HF directory only: llama.cpp has no MPNet (checked below on its converter)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from frink_subprocess import child_env, embed_json, frink_command
from model_checks import configured, cosines
from script_loader import load_script
from serve_process import Server

from frink_cli import api
from frink_cli.decoder import Decoder
from frink_cli.errors import FrinkError

pytest.importorskip("torch")
pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

FAMILIES = ("mpnet", "embeddinggemma")
# 242 tokens: past MPNet's exact buckets (< 8) and its max_distance (128), and many times
# the Gemma fixture's window.
LONG = " ".join(f"word{i} and more" for i in range(60))
TEXTS = ["Hello world", "a", "", "Tiny random encoders: 1 2 3!", LONG]
# A decoration switched off moves some value this far (a match is within 1e-4).
FAR = 0.02


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> dict[str, Path]:
    make = load_script("make_tiny_encoders")
    d = tmp_path_factory.mktemp("tiny-encoders")
    return {
        "mpnet": make.make_mpnet(minilm_path, d / "mpnet"),
        "embeddinggemma": make.make_embedding_gemma(minilm_path, d / "embeddinggemma"),
    }


@pytest.fixture(scope="module")
def references(folders: dict[str, Path]) -> dict[str, np.ndarray]:
    return {
        k: st.SentenceTransformer(str(p), device="cpu").encode(TEXTS) for k, p in folders.items()
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_sentence_transformers(
    family: str, folders: dict[str, Path], references: dict[str, np.ndarray]
) -> None:
    m = api.load(folders[family])
    assert len(m.embed_tokens(LONG)) > 200
    got = m.embed(TEXTS)
    ref = references[family]
    assert got.shape == ref.shape
    assert cosines(got, ref).min() >= 0.9999
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_is_each_input_alone(family: str, folders: dict[str, Path]) -> None:
    m = api.load(folders[family])
    together = m.embed(TEXTS)
    for i, t in enumerate(TEXTS):
        np.testing.assert_array_equal(together[i], m.embed([t])[0])


def _switched_off(m: api.Model, **changes: object) -> api.Model:
    m.decoder = Decoder(configured(m.config, **changes), m.decoder.host.w, None)
    return m


@pytest.mark.parametrize(
    "family,change",
    [
        ("mpnet", {"rel_buckets": 0}),  # the relative bias
        ("embeddinggemma", {"bidirectional": False}),  # causal Gemma 3 attention
        ("embeddinggemma", {"sliding_window": None}),  # the symmetric window
        ("embeddinggemma", {"dense": []}),  # the Dense layers
    ],
)
def test_each_decoration_moves_the_embeddings(
    family: str, change: dict, folders: dict[str, Path], references: dict[str, np.ndarray]
) -> None:
    m = api.load(folders[family])
    if "dense" in change:
        m.embed_plan.dense = []  # (64 -> 128 -> 64: the width stays)
    else:
        m = _switched_off(m, **change)
    got = m.embed(TEXTS)
    assert np.abs(got - references[family]).max() > FAR


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_embed_and_the_route(family: str, folders: dict[str, Path]) -> None:
    openai = pytest.importorskip("openai")
    m = api.load(folders[family])
    texts = TEXTS[:2]
    got = embed_json(folders[family], texts)
    np.testing.assert_allclose(got, m.embed(texts), atol=1e-6)
    server = Server(folders[family])
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        name = client.models.list().data[0].id
        r = client.embeddings.create(model=name, input=texts, encoding_format="float")
        served = np.array([d.embedding for d in r.data], np.float32)
        np.testing.assert_allclose(served, m.embed(texts), atol=1e-6)
    finally:
        server.stop()


@pytest.mark.parametrize(
    "family,names",
    [
        ("mpnet", ("rel_buckets", "rel_max_distance", "position_offset")),
        ("embeddinggemma", ("bidirectional",)),
    ],
)
def test_info_names_the_decorations(family: str, names: tuple, folders: dict[str, Path]) -> None:
    out = subprocess.run(
        [*frink_command(), "info", str(folders[family])],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
        check=True,
    )
    line = next(s for s in out.stdout.splitlines() if s.startswith("decorations:"))
    for name in names:
        assert name in line


def test_cuda_refuses_the_layers_by_name(folders: dict[str, Path]) -> None:
    from frink_cli.backends.cupy import eligibility as cuda

    for family, want in (("mpnet", "relative bias"), ("embeddinggemma", "bidirectional")):
        cfg = api.load(folders[family]).config
        assert all(r is not None and want in r for r in cuda.layer_refusals(cfg))


def test_metal_carries_embeddinggemma_and_refuses_mpnet_by_name(folders: dict[str, Path]) -> None:
    """MLX (on its CPU device here): EmbeddingGemma's bidirectional, symmetric-window layers
    in one submission, as the host computes them; MPNet's relative bias refused by name, so
    the host runs it."""
    pytest.importorskip("mlx.core")
    import frink_cli

    for family in FAMILIES:
        host = api.load(folders[family])
        dev = frink_cli.load(folders[family], backend="metal")
        ledger = dev.decoder.backend.ledger
        np.testing.assert_allclose(dev.embed(TEXTS), host.embed(TEXTS), atol=1e-5, rtol=0)
        if family == "mpnet":
            assert not ledger.submissions
            assert set(ledger.refusals) == {"attention: relative bias"}
        else:
            assert ledger.total() >= 1 and not ledger.refusals and not ledger.failures


def _hostile(folder: Path, tmp_path: Path, **changes: object) -> Path:
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(changes)
    (bad / "config.json").write_text(json.dumps(cfg))
    return bad


@pytest.mark.parametrize(
    "family,changes,named",
    [
        ("mpnet", {"relative_attention_num_buckets": 0}, "relative_attention_num_buckets"),
        ("mpnet", {"relative_attention_max_distance": 10**12}, "max distance"),
        ("embeddinggemma", {"sliding_window": 0}, "sliding_window"),
        ("embeddinggemma", {"sliding_window": 1}, "sliding_window"),
    ],
)
def test_hostile_configs_are_refused_by_name(
    family: str, changes: dict, named: str, folders: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(FrinkError, match=named):
        api.load(_hostile(folders[family], tmp_path, **changes))


def test_bucket_checks_refuse_by_name() -> None:
    from frink_cli.archs.mpnet import check_buckets

    check_buckets("x", 32, 128)
    for buckets, distance in ((0, 128), (31, 128), (32, 8), (32, 10**9)):
        with pytest.raises(FrinkError, match="mpnet relative_"):
            check_buckets("x", buckets, distance)


def test_llama_cpp_has_no_mpnet() -> None:
    """Why MPNet is an HF directory only: llama.cpp 0.3.36's converter has no MPNet class."""
    try:
        root = load_script("llama_cpp_converter").ensure_converter()
    except Exception as e:  # noqa: BLE001 - no sdist here: nothing to read
        pytest.skip(f"no llama.cpp converter sources: {e}")
    sources = [p.read_text(errors="replace") for p in root.rglob("*.py")]
    assert len(sources) > 10
    assert not any("MPNet" in s for s in sources)


# --- EmbeddingGemma as a GGUF: llama.cpp's converter and its embedding mode ------------------


@pytest.fixture(scope="module")
def gemma_gguf(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny EmbeddingGemma folder converted by llama.cpp's converter (its EmbeddingGemma
    class, arch gemma-embedding), the Dense modules written as dense_2 / dense_3."""
    conv = load_script("llama_cpp_converter")
    out = tmp_path_factory.mktemp("gemma-gguf") / "embeddinggemma.gguf"
    try:
        return conv.convert(
            folders["embeddinggemma"], out, extra_args=("--sentence-transformers-dense-modules",)
        )
    except Exception as e:  # noqa: BLE001 - no converter sources here
        pytest.skip(f"llama.cpp's converter did not run: {e}")


def test_gguf_matches_llama_cpp_and_the_folder(
    gemma_gguf: Path, folders: dict[str, Path], references: dict[str, np.ndarray]
) -> None:
    """The GGUF (no vocabulary: ids from the folder's tokenizer) against llama.cpp's embedding
    mode on the same file, and against sentence-transformers on the folder."""
    llama_cpp = pytest.importorskip("llama_cpp")
    hf, gg = api.load(folders["embeddinggemma"]), api.load(gemma_gguf)
    assert gg.config.arch == "gemma-embedding"
    assert len(gg.embed_plan.dense) == 2
    seqs = [hf.embed_tokens(t) for t in TEXTS]
    got = gg.embed_ids(seqs)
    llm = llama_cpp.Llama(
        model_path=str(gemma_gguf),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        n_threads=2,
        verbose=False,
    )
    # The file has no vocabulary: embed() tokenizes each input, here an index into seqs.
    llm.tokenize = lambda text, *a, **k: list(seqs[int(text)])
    ref = np.array(llm.embed([str(i) for i in range(len(seqs))], normalize=True), np.float32)
    assert cosines(got, ref).min() >= 0.9999
    np.testing.assert_allclose(got, ref, atol=5e-4, rtol=0)
    assert cosines(got, references["embeddinggemma"]).min() >= 0.9999
