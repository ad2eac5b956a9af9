"""Embeddings against their references: all-MiniLM-L6-v2 against sentence-transformers on
the same folder, a tiny random BERT against transformers' BertModel (hidden states) and,
as sentence-transformers folders with other pooling and Dense modules, against
sentence-transformers again."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from frink_subprocess import child_env, embed_json, frink_command
from model_checks import cosines
from serve_process import Server

from frink_cli import api
from frink_cli.embedding import EmbedPlan
from frink_cli.errors import FrinkError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def corpus() -> list[str]:
    """50 varied texts: short, long (past MiniLM's 256 tokens), punctuation, unicode,
    numbers, whitespace."""
    base = [
        "Hello world",
        "a",
        "",
        "   ",
        "The quick brown fox jumps over the lazy dog.",
        "What is the capital of France?",
        "Paris is the capital and most populous city of France.",
        "!!!???...;;;:::",
        "e-mail: someone@example.com, web: https://example.org/path?q=1&r=2",
        "3.14159 2.71828 1.41421 -0.5e10 42",
        "1234567890" * 5,
        "Ünïcödé tëxt with àccents",
        "日本語のテキストです。東京は日本の首都です。",
        "Русский текст: быстрая коричневая лиса.",
        "Emoji: 😀🎉🚀 ☃ ♥",
        "Tabs\tand\nnewlines\r\nmixed",
        "UPPER CASE SHOUTING TEXT",
        "mIxEd CaSe WoRdS",
        "C'est la vie, n'est-ce pas?",
        "def f(x): return x ** 2  # python code",
        "SELECT * FROM users WHERE id = 7;",
        "The mitochondria is the powerhouse of the cell.",
        "I love machine learning and natural language processing.",
        "Embeddings map text to vectors in a high-dimensional space.",
        "العربية نص قصير",
        "한국어 문장입니다.",
        "Ελληνικά κείμενο",
        "[CLS] [SEP] [MASK] literal special tokens",
        "supercalifragilisticexpialidocious antidisestablishmentarianism",
        "a b c d e f g h i j k l m n o p q r s t u v w x y z",
        "The year 2024 had 366 days; 2023 had 365.",
        "$100.00 + €50,25 = ?",
        "(parentheses) [brackets] {braces} <angles>",
        "\"quoted\" 'single' `backtick`",
        "one two three four five six seven eight nine ten " * 3,
        "A long sentence about nothing in particular, " * 40,
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 60,
    ]
    more = [f"Sentence number {i} talks about topic {i * 7 % 13}." for i in range(50 - len(base))]
    texts = base + more
    assert len(texts) == 50
    return texts


# --- the real model -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm(minilm_path: Path) -> api.Model:
    return api.load(minilm_path)


def test_minilm_matches_sentence_transformers(minilm: api.Model, minilm_path: Path) -> None:
    texts = corpus()
    ref = st.SentenceTransformer(str(minilm_path), device="cpu").encode(texts)
    # The long texts are cut at max_seq_length (256) as sentence-transformers cuts them.
    got = minilm.embed(texts, truncate=True)
    assert got.shape == ref.shape == (50, 384)
    assert cosines(got, ref).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_minilm_batch_is_each_alone(minilm: api.Model) -> None:
    texts = ["short", "a somewhat longer text than the first one", "mid length text"]
    together = minilm.embed(texts)
    for i, t in enumerate(texts):
        np.testing.assert_array_equal(together[i], minilm.embed([t])[0])


def test_minilm_refuses_a_long_input_unless_truncated(minilm: api.Model) -> None:
    long = "word " * 400
    with pytest.raises(FrinkError, match="longer than the model's 256"):
        minilm.embed([long])
    ids = minilm.embed_tokens(long, truncate=True)
    assert len(ids) == 256 and ids[0] == 101 and ids[-1] == 102


def test_minilm_token_ids_input(minilm: api.Model) -> None:
    ids = minilm.embed_tokens("Hello world")
    np.testing.assert_array_equal(minilm.embed_ids([ids]), minilm.embed(["Hello world"]))


def test_minilm_has_no_logits(minilm: api.Model) -> None:
    with pytest.raises(FrinkError, match="embedding model"):
        minilm.logits([101, 102])


# --- a tiny random BERT -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> Path:
    """A random 2-layer BertModel (LayerNorms and biases drawn away from their defaults,
    so a dropped one fails) with MiniLM's WordPiece vocabulary, saved as safetensors."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=64,
        layer_norm_eps=1e-12,
    )
    model = transformers.BertModel(cfg, add_pooling_layer=True).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
    d = tmp_path_factory.mktemp("tiny-bert")
    model.save_pretrained(d, safe_serialization=True)
    for f in TOKENIZER_FILES:
        shutil.copy(minilm_path / f, d / f)
    return d


TINY_TEXTS = ["Hello world", "a", "", "Tiny random BERT, bidirectional attention: 1 2 3!"]


def test_tiny_bert_hidden_states_match_transformers(tiny_bert: Path) -> None:
    ref_model = transformers.BertModel.from_pretrained(tiny_bert).eval()
    tok = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    m = api.load(tiny_bert)
    seqs = [m.embed_tokens(t) for t in TINY_TEXTS]
    rows = m.decoder.hidden_batch([np.asarray(s) for s in seqs])
    for text, ids, got in zip(TINY_TEXTS, seqs, rows):
        enc = tok(text, return_tensors="pt")
        assert enc["input_ids"][0].tolist() == ids
        with torch.no_grad():
            ref = ref_model(**enc).last_hidden_state[0].numpy()
        np.testing.assert_allclose(got, ref, atol=2e-4, rtol=0)


def _st_folder(base: Path, out: Path, pooling: str, dense: bool, normalize: bool) -> Path:
    models = pytest.importorskip("sentence_transformers.models")
    word = models.Transformer(str(base), max_seq_length=48)
    dim = getattr(word, "get_embedding_dimension", word.get_word_embedding_dimension)()
    modules = [word, models.Pooling(dim, pooling_mode=pooling)]
    if dense:
        torch.manual_seed(1)
        modules.append(models.Dense(64, 24, bias=True, activation_function=torch.nn.Tanh()))
    if normalize:
        modules.append(models.Normalize())
    st.SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


@pytest.mark.parametrize(
    "pooling,dense,normalize",
    [("cls", True, True), ("lasttoken", False, False), ("mean", True, False)],
)
def test_tiny_sentence_transformers_folders(
    tiny_bert: Path, tmp_path: Path, pooling: str, dense: bool, normalize: bool
) -> None:
    folder = _st_folder(tiny_bert, tmp_path / "st", pooling, dense, normalize)
    ref = st.SentenceTransformer(str(folder), device="cpu").encode(TINY_TEXTS)
    m = api.load(folder)
    got = m.embed(TINY_TEXTS)
    assert got.shape == ref.shape
    assert cosines(got, ref).min() >= 0.99999
    np.testing.assert_allclose(got, ref, atol=2e-4, rtol=1e-3)


# --- the CLI and the server -----------------------------------------------------------------


def test_cli_embed_json(minilm: api.Model, minilm_path: Path) -> None:
    texts = ["Hello world", "Second text."]
    got = embed_json(minilm_path, texts)
    np.testing.assert_allclose(got, minilm.embed(texts), atol=1e-6)
    plain = subprocess.run(
        [*frink_command(), "embed", str(minilm_path), texts[0]],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
        check=True,
    )
    np.testing.assert_allclose(
        np.array(plain.stdout.split(), np.float32), got[0], rtol=1e-6, atol=1e-7
    )


@pytest.fixture(scope="module")
def server(minilm_path: Path) -> Iterator[Server]:
    s = Server(minilm_path)
    try:
        yield s
    finally:
        s.stop()


def test_route_with_the_openai_client(server: Server, minilm: api.Model) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    texts = ["The first text.", "Another, longer text about embeddings."]
    r = client.embeddings.create(model=server_model(client), input=texts)
    got = np.array([d.embedding for d in r.data], np.float32)
    np.testing.assert_allclose(got, minilm.embed(texts), atol=1e-6)
    assert [d.index for d in r.data] == [0, 1]
    n_tokens = sum(len(minilm.embed_tokens(t)) for t in texts)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n_tokens
    # The client asks for base64 by default when numpy is there; float explicitly.
    f = client.embeddings.create(
        model=server_model(client), input=texts[0], encoding_format="float"
    )
    np.testing.assert_allclose(np.array(f.data[0].embedding, np.float32), got[0], atol=1e-6)
    # Token ids, one list and a list of lists.
    ids = minilm.embed_tokens(texts[0])
    one = client.embeddings.create(model=server_model(client), input=ids)
    many = client.embeddings.create(model=server_model(client), input=[ids, ids])
    np.testing.assert_allclose(np.array(one.data[0].embedding), got[0], atol=1e-6)
    assert len(many.data) == 2
    # Matryoshka: the first 64 values, renormalized.
    cut = client.embeddings.create(model=server_model(client), input=texts[0], dimensions=64)
    v = np.array(cut.data[0].embedding)
    assert v.shape == (64,)
    np.testing.assert_allclose(v, got[0][:64] / np.linalg.norm(got[0][:64]), atol=1e-6)


def server_model(client: Any) -> str:
    return client.models.list().data[0].id


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": []}, "input"),
        ({"input": 7}, "input"),
        ({"input": ["a", 1]}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": [[1, "x"]]}, "input"),
        ({"input": [10**9]}, "input"),
        ({"input": ["x"] * 10_000}, "input"),
        ({"input": "word " * 400}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "dimensions": 10_000}, "dimensions"),
        ({"input": "a", "truncate": "yes"}, "truncate"),
        ({"input": "a", "frobnicate": 1}, "frobnicate"),
        ({}, "input"),
    ],
)
def test_route_refuses_bad_input(server: Server, body: dict, param: str) -> None:
    req = urllib.request.Request(
        server.url + "/v1/embeddings",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=120)
    assert e.value.code == 400
    err = json.loads(e.value.read())["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_route_truncates_when_asked(server: Server, minilm: api.Model) -> None:
    body = {"input": "word " * 400, "truncate": True}
    req = urllib.request.Request(
        server.url + "/v1/embeddings",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        data = json.loads(r.read())
    assert data["usage"]["prompt_tokens"] == 256
    np.testing.assert_allclose(
        data["data"][0]["embedding"], minilm.embed(["word " * 400], truncate=True)[0], atol=1e-6
    )


# --- a decoder's embeddings -------------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_decoder_pooling_matches_llama_cpp(smollm2_f32: Path, pooling: str) -> None:
    """A generative model's embeddings (llama-server's --pooling last / mean): its final
    normed rows pooled and normalized, against llama.cpp's embedding mode on the same F32
    file."""
    llama_cpp = pytest.importorskip("llama_cpp")
    f32 = smollm2_f32
    texts = ["Hello world", "The quick brown fox jumps over the lazy dog.", "1 + 1 = 2"]
    m = api.load(f32)
    m.embed_plan = EmbedPlan(pooling=pooling)
    got = m.embed(texts)
    code = {"last": llama_cpp.LLAMA_POOLING_TYPE_LAST, "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN}
    llm = llama_cpp.Llama(
        model_path=str(f32),
        embedding=True,
        pooling_type=code[pooling],
        n_ctx=128,
        type_k=0,
        type_v=0,
        n_threads=2,
        verbose=False,
    )
    assert [m.embed_tokens(t) for t in texts] == [llm.tokenize(t.encode()) for t in texts]
    ref = np.array(llm.embed(texts, normalize=True), np.float32)
    assert cosines(got, ref).min() >= 0.9999
    # The same through `frink embed --pooling` (llama-server's flag, also on frink serve).
    cli = embed_json(f32, texts, "--pooling", pooling)
    assert cosines(cli, ref).min() >= 0.9999


@pytest.mark.parametrize("command", ["embed", "serve"])
def test_an_unknown_pooling_is_one_line(command: str, tmp_path: Path) -> None:
    args = [str(tmp_path / "missing.gguf"), *(["text"] if command == "embed" else [])]
    out = subprocess.run(
        [*frink_command(), command, *args, "--pooling", "rank"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert out.returncode != 0
    assert out.stderr.strip() == "frink: error: --pooling 'rank': one of mean, cls, last"


_USER_HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 3}),
        ("/v1/chat/completions", {"messages": _USER_HI}),
        ("/v1/messages", {"max_tokens": 3, "messages": _USER_HI}),
        ("/api/chat", {"messages": _USER_HI}),
        ("/api/generate", {"prompt": "hi"}),
    ],
)
def test_an_encoder_refuses_to_generate(server: Server, path: str, body: dict) -> None:
    status, answer = _post(server, path, {**body, "model": _served_name(server)})
    assert status == 400
    error = answer["error"]  # each API's own shape: OpenAI's and Anthropic's an object
    assert "only embeds" in (error if isinstance(error, str) else error["message"])
    assert server.get("/health")[0] == 200


def _post(server: Server, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# --- Ollama's embedding routes, through the official client ---------------------------------


def test_ollama_embed_matches_sentence_transformers(
    server: Server, minilm: api.Model, minilm_path: Path
) -> None:
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=server.url)
    texts = [t for t in corpus() if t.strip()][:12]
    r = client.embed(model=_served_name(server), input=texts)
    got = np.array(r.embeddings, np.float32)
    ref = st.SentenceTransformer(str(minilm_path), device="cpu").encode(texts)
    assert got.shape == ref.shape
    assert cosines(got, ref).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # as Ollama's
    assert r.prompt_eval_count == sum(len(minilm.embed_tokens(t, True)) for t in texts)
    one = client.embed(model=_served_name(server), input=texts[0])
    np.testing.assert_allclose(one.embeddings[0], got[0], atol=1e-6)
    legacy = client.embeddings(model=_served_name(server), prompt=texts[0])
    np.testing.assert_allclose(legacy.embedding, ref[0], atol=1e-5)
    cut = client.embed(model=_served_name(server), input=texts[0], dimensions=32)
    v = np.array(cut.embeddings[0])
    np.testing.assert_allclose(v, got[0][:32] / np.linalg.norm(got[0][:32]), atol=1e-6)
    assert client.show(_served_name(server)).capabilities == ["embedding"]


def test_ollama_embed_truncates_unless_told_not_to(server: Server, minilm: api.Model) -> None:
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=server.url)
    long = "word " * 400
    r = client.embed(model=_served_name(server), input=long)
    assert r.prompt_eval_count == 256
    np.testing.assert_allclose(r.embeddings[0], minilm.embed([long], truncate=True)[0], atol=1e-6)
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model=_served_name(server), input=long, truncate=False)
    assert e.value.status_code == 400 and "256" in e.value.error
    assert client.embed(model=_served_name(server), input=[]).embeddings == []


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/api/embed", {"input": 7}, "input"),
        ("/api/embed", {"input": ["a", 1]}, "input"),
        ("/api/embed", {"input": ["a", ""]}, "input"),
        ("/api/embed", {"input": ["x"] * 10_000}, "input"),
        ("/api/embed", {"input": "a", "truncate": "yes"}, "truncate"),
        ("/api/embed", {"input": "a", "dimensions": 0}, "dimensions"),
        ("/api/embed", {"input": "a", "dimensions": 10_000}, "dimensions"),
        ("/api/embed", {"input": "a", "options": []}, "options"),
        ("/api/embeddings", {"prompt": ["a"]}, "prompt"),
    ],
)
def test_ollama_embed_refuses_bad_input(server: Server, path: str, body: dict, field: str) -> None:
    status, answer = _post(server, path, {"model": _served_name(server), **body})
    assert status == 400
    assert set(answer) == {"error"} and answer["error"].startswith(field)
    status, answer = _post(server, path, {**body, "model": "nope"})
    assert status in (400, 404) and set(answer) == {"error"}


def _served_name(server: Server) -> str:
    return server.get("/v1/models")[1]["data"][0]["id"]
