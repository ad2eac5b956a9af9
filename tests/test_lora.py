"""LoRA adapters against transformers + peft and llama.cpp's --lora on the tiny llamas.

The adapters (scripts/make_lora_fixtures.py) are random PEFT LoRAs (B not zero, alpha not
r) over the tiny fixtures' HF weights: q/v only, every projection, every projection with
rsLoRA, and every projection over a quantized base. Each is checked as a PEFT directory
over the HF directory and the GGUF (transformers' logits), and as llama.cpp's own
conversion over the GGUF (llama.cpp's logits and greedy tokens).
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import fixture_cache_root
from fixture_copies import write_out
from llama_quantize import llama_quantize
from script_loader import load_script
from serve_process import Server

import frink_cli
from frink_cli.cli_lora import join_scaled, lora_args
from frink_cli.errors import FrinkError
from frink_cli.model.lora import LoraAdapter
from frink_cli.quant.blocks import QuantRows
from frink_cli.sampling import SamplingParams
from frink_cli.serve.engine import Engine, Job

_MAKE = Path(__file__).resolve().parent.parent / "scripts" / "make_lora_fixtures.py"
TOL = 2e-3
Q8_0 = 8  # GGML_TYPE_Q8_0
_make_tiny = load_script("make_tiny_models")


@pytest.fixture(scope="module")
def lora_dir(tiny_models: Path) -> Path:
    """The adapters and their references, made on first use."""
    out = fixture_cache_root() / "lora"
    pytest.importorskip("peft")
    proc = subprocess.run(
        [sys.executable, str(_MAKE), str(tiny_models), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/make_lora_fixtures.py failed:\n{proc.stdout[-3000:]}{proc.stderr[-4000:]}",
            pytrace=False,
        )
    return out


def _ref(lora_dir: Path, name: str) -> dict[str, np.ndarray]:
    with np.load(lora_dir / f"{name}_ref.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", ["qv", "all", "all_rs"])
@pytest.mark.parametrize("base", ["hf", "model.gguf"])
def test_peft_adapter_matches_transformers(
    lora_dir: Path, tiny_models: Path, name: str, base: str
) -> None:
    ref = _ref(lora_dir, name)
    for scale in (1.0, 0.5, 0.0):
        m = frink_cli.load(tiny_models / "llama" / base, lora=[(lora_dir / name, scale)])
        want = ref[f"hf_{scale}"]
        for step in (False, True):
            got = m.logits(ref["tokens"], step=step)
            assert np.abs(got - want).max() < TOL, (name, base, scale, step)


@pytest.mark.parametrize("name", ["qv", "all"])
def test_gguf_adapter_matches_llama_cpp(lora_dir: Path, tiny_models: Path, name: str) -> None:
    ref = _ref(lora_dir, name)
    for scale in (1.0, 0.5):
        m = frink_cli.load(
            tiny_models / "llama" / "model.gguf", lora=[(lora_dir / f"{name}.gguf", scale)]
        )
        assert np.abs(m.logits(ref["tokens"]) - ref[f"cpp_{scale}"]).max() < TOL
        greedy = ref[f"cpp_greedy_{scale}"]
        got = m.generate_ids(list(ref["tokens"]), max_tokens=len(greedy), temperature=0.0)
        assert list(got) == list(greedy), scale


def test_quantized_base_stays_quantized(lora_dir: Path, tiny_models: Path) -> None:
    """Over a Q8_0 base (llama.cpp's quantizer) the adapter rides beside the blocks, and
    llama.cpp's greedy run with the converted adapter is matched."""
    q8 = lora_dir / "llama_q.Q8_0.gguf"
    if not q8.is_file():
        llama_quantize(tiny_models / "llama_q" / "model.gguf", q8, Q8_0, False, 7)
    ref = _ref(lora_dir, "q_all")
    adapter = lora_dir / "q_all.gguf"
    m = frink_cli.load(q8, lora=[(adapter, 1.0)])
    lw = m.decoder.host.w.layers[0]
    assert isinstance(lw.qkv.w, QuantRows) and len(lw.qkv.lora) == 3
    assert isinstance(lw.down.w, QuantRows) and len(lw.down.lora) == 1
    want, _ = _make_tiny.llama_cpp_greedy(q8, ref["tokens"], 8, lora=(adapter, 1.0))
    got = m.generate_ids(list(ref["tokens"]), max_tokens=len(want), temperature=0.0)
    assert list(got) == list(want)
    # Merged at load (--lora-merge): the adapted matrices become f32, the rest stay blocks.
    merged = frink_cli.load(q8, lora=[(adapter, 1.0)], lora_merge=True)
    w = merged.decoder.host.w
    assert isinstance(w.layers[0].qkv.w, np.ndarray) and w.layers[0].qkv.merged
    assert not w.layers[0].qkv.lora and merged.lora == []
    assert isinstance(w.output.w, QuantRows)
    got = merged.generate_ids(list(ref["tokens"]), max_tokens=len(want), temperature=0.0)
    assert list(got) == list(want)


def test_metal_carries_adapters(
    lora_dir: Path, tiny_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metal runs the adapters in its traced graph (every projection, fused q/k/v and
    gate/up included): transformers' logits at each scale, batch and step, one submission
    per decode token, and a new scale runs the graph already compiled. Merged at load, the
    same logits."""
    pytest.importorskip("mlx.core")
    from frink_cli.backends.mlx.lora import DeviceLora

    ref = _ref(lora_dir, "all")
    base = tiny_models / "llama" / "model.gguf"
    m = frink_cli.load(base, backend="metal", lora=[(lora_dir / "all", 1.0)])
    ledger = m.decoder.backend.ledger
    for scale in (1.0, 0.5, 0.0):
        m.lora[0].scale = scale
        for step in (False, True):
            got = m.logits(ref["tokens"], step=step)
            assert np.abs(got - ref[f"hf_{scale}"]).max() < TOL, (scale, step)
    assert not ledger.refusals
    assert m.decoder.backend.resident_layers() == set(range(m.config.n_layer))
    cache = m.decoder.new_cache(64)
    m.decoder.step(np.asarray(ref["tokens"]), cache)
    m.decoder.step(np.asarray([5]), cache)  # the decode step's graph, traced once
    traced: list[object] = []
    monkeypatch.setattr(DeviceLora, "__call__", lambda self, x: traced.append(x))
    for scale in (0.5, 1.0):
        m.lora[0].scale = scale
        ledger.reset()
        m.decoder.step(np.asarray([6]), cache)
        assert dict(ledger.submissions) == {"dense-run+lm-head": 1}
    assert not traced  # the scales are an input: no retrace
    monkeypatch.undo()
    merged = frink_cli.load(base, backend="metal", lora=[(lora_dir / "all", 0.5)], lora_merge=True)
    for step in (False, True):
        assert np.abs(merged.logits(ref["tokens"], step=step) - ref["hf_0.5"]).max() < TOL


def test_scale_changes_at_run_time(lora_dir: Path, tiny_models: Path) -> None:
    """--lora-init-without-apply loads at scale 0 (the base's logits); setting the
    adapter's scale later applies it (a server's /lora-adapters)."""
    ref = _ref(lora_dir, "qv")
    m = frink_cli.load(
        tiny_models / "llama" / "hf", lora=[(lora_dir / "qv", 1.0)], lora_apply=False
    )
    (ad,) = m.lora
    assert isinstance(ad, LoraAdapter) and ad.scale == 0.0
    assert np.abs(m.logits(ref["tokens"]) - ref["hf_0.0"]).max() < TOL
    ad.scale = 0.5
    assert np.abs(m.logits(ref["tokens"]) - ref["hf_0.5"]).max() < TOL


def _edited_peft(
    src: Path,
    dst: Path,
    drop: str | None = None,
    rename: tuple[str, str] = ("", ""),
    **conf: object,
) -> Path:
    """A copy of a PEFT directory with config keys changed, a tensor dropped, or names
    edited (rename: (old, new) substring)."""
    from safetensors.numpy import load_file, save_file

    dst.mkdir()
    cfg = json.loads((src / "adapter_config.json").read_text())
    cfg.update(conf)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    tensors = load_file(src / "adapter_model.safetensors")
    if drop is not None:
        tensors = {k: v for k, v in tensors.items() if drop not in k}
    if rename[0]:
        tensors = {k.replace(*rename): v for k, v in tensors.items()}
    save_file(tensors, dst / "adapter_model.safetensors")
    return dst


def test_refusals(lora_dir: Path, tiny_models: Path, tmp_path: Path) -> None:
    """Each is refused by name, before the base's weights load."""
    base = tiny_models / "llama" / "model.gguf"
    qv = lora_dir / "qv"
    cases = {
        "shapes A": (tiny_models / "llama_q" / "model.gguf", qv),  # another model's shapes
        "no lora_b": (
            base,
            _edited_peft(qv, tmp_path / "pair", drop="layers.1.self_attn.v_proj.lora_B"),
        ),
        "rank 4 is not": (base, _edited_peft(qv, tmp_path / "r", r=8)),
        "DoRA": (base, _edited_peft(qv, tmp_path / "dora", use_dora=True)),
        "not one frink adapts": (
            base,
            _edited_peft(qv, tmp_path / "norm", rename=("self_attn.v_proj", "input_layernorm")),
        ),
        "for 'llama', the model is 'qwen2'": (
            tiny_models / "qwen2" / "model.gguf",
            lora_dir / "qv.gguf",
        ),
        "not found": (base, tmp_path / "nothing"),
        "not a LoRA adapter": (base, tiny_models / "llama" / "model.gguf"),
    }
    for why, (model, adapter) in cases.items():
        with pytest.raises(FrinkError, match=why):
            frink_cli.load(model, lora=[(adapter, 1.0)])
    with pytest.raises(FrinkError, match="cuda: LoRA"):
        frink_cli.load(base, backend="cuda", lora=[(qv, 1.0)])
    for apply in (False, True):
        with pytest.raises(FrinkError, match="--lora-merge: needs adapters applied"):
            frink_cli.load(
                base, lora=[(qv, 1.0)] if apply else [], lora_apply=False, lora_merge=True
            )


def _engine_tokens(engine: Engine, jobs: list[tuple[list[int], dict[int, float] | None]], n: int):
    """Every job submitted at once to a running engine; each one's answer tokens."""
    done: queue.Queue = queue.Queue()
    results: dict[int, list[int]] = {}

    def emitter(i: int) -> Callable[[str, object], None]:
        def emit(kind: str, payload: object) -> None:
            if kind == "done":
                results[i] = list(payload.tokens)  # type: ignore[attr-defined]
            if kind in ("done", "error"):
                done.put((kind, payload))

        return emit

    for i, (prompt, lora) in enumerate(jobs):
        engine.submit(Job(prompt, SamplingParams(temperature=0.0), n, (), emitter(i), lora=lora))
    for _ in jobs:
        kind, payload = done.get(timeout=120)
        assert kind == "done", payload
    return [results[i] for i in range(len(jobs))]


@pytest.mark.parametrize("backend", ["numpy", "metal"])
def test_requests_with_different_adapters_share_a_batch(
    lora_dir: Path, tiny_models: Path, backend: str
) -> None:
    """A server's jobs, each with its own adapter scales, stepped together: each gets what
    it gets alone, and the alone runs are llama.cpp's with that adapter. On metal the
    mixed batch is one device step (each row reads its own scales)."""
    if backend == "metal":
        pytest.importorskip("mlx.core")
    qv, every = _ref(lora_dir, "qv"), _ref(lora_dir, "all")
    m = frink_cli.load(
        tiny_models / "llama" / "model.gguf",
        backend=backend,
        lora=[(lora_dir / "qv.gguf", 1.0), (lora_dir / "all.gguf", 1.0)],
    )
    prompt = [int(t) for t in qv["tokens"]]
    jobs = [(prompt, {0: 1.0}), (prompt, {1: 0.5}), (prompt, {}), (prompt[:9], None)]
    engine = Engine(m.decoder, None, n_parallel=4, n_ctx=64, prefill_chunk=16)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        alone = [_engine_tokens(engine, [job], 8)[0] for job in jobs]
        together = _engine_tokens(engine, jobs, 8)
    finally:
        engine.stop()
        thread.join(30)
    assert alone[0] == qv["cpp_greedy_1.0"].tolist()
    assert alone[1] == every["cpp_greedy_0.5"].tolist()
    assert together == alone
    if backend == "metal":
        ledger = m.decoder.backend.ledger
        assert ledger.submissions["dense-run+batch+lm-head"] > 0 and not ledger.refusals
    with pytest.raises(FrinkError, match="adapter id"):
        engine.submit(Job(prompt, SamplingParams(), 1, (), lambda k, p: None, lora={2: 1.0}))


def test_server_lora_adapters(lora_dir: Path, tiny_models: Path) -> None:
    """`frink serve --lora A --lora-scaled B 0.5`, driven by the openai client: GET and
    POST /lora-adapters as llama-server has them, and a request's own `lora`, each answer
    llama.cpp's greedy tokens with that adapter."""
    openai = pytest.importorskip("openai")
    qv, every = _ref(lora_dir, "qv"), _ref(lora_dir, "all")
    prompt = [int(t) for t in qv["tokens"]]
    adapters = ("--lora", str(lora_dir / "qv.gguf"), "--lora-scaled", str(lora_dir / "all.gguf"))
    server = Server(tiny_models / "llama" / "model.gguf", *adapters, "0.5", "--parallel", "2")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)

        def tokens(lora: list[dict] | None) -> list[int]:
            extra: dict = {"return_tokens": True, **({"lora": lora} if lora is not None else {})}
            r = client.completions.create(
                model="model", prompt=prompt, max_tokens=8, temperature=0.0, extra_body=extra
            )
            return r.choices[0].model_extra["tokens"]

        status, listed = server.get("/lora-adapters")
        assert status == 200
        assert [(a["id"], a["scale"]) for a in listed] == [(0, 1.0), (1, 0.5)]  # type: ignore[index]
        assert tokens([{"id": 0, "scale": 1.0}]) == qv["cpp_greedy_1.0"].tolist()
        assert tokens([{"id": 1, "scale": 0.5}]) == every["cpp_greedy_0.5"].tolist()
        body = json.dumps([{"id": 1, "scale": 0.5}]).encode()
        assert server.request("POST", "/lora-adapters", body)[0] == 200
        assert tokens(None) == every["cpp_greedy_0.5"].tolist()  # the global scales now
        assert [a["scale"] for a in server.get("/lora-adapters")[1]] == [0.0, 0.5]  # type: ignore[index]
        with pytest.raises(openai.BadRequestError, match="adapter id"):
            tokens([{"id": 5, "scale": 1.0}])
    finally:
        server.close()


def test_lora_flags() -> None:
    """--lora-scaled's two words reach the command as one value; --lora is scale 1."""
    argv = ["run", "m.gguf", "--lora-scaled", "a.gguf", "0.5", "--lora", "b", "-p", "x"]
    joined = join_scaled(argv)
    assert joined[:3] == ["run", "m.gguf", "--lora-scaled"] and joined[4:] == argv[5:]
    assert lora_args(["b"], [joined[3]], False, True) == (
        (("b", 1.0), ("a.gguf", 0.5)),
        True,
        True,
    )
    assert join_scaled(["--lora-scaled", "a"]) == ["--lora-scaled", "a"]
    for bad in ("a", join_scaled(["--lora-scaled", "a", "nan"])[1]):
        with pytest.raises(FrinkError, match="needs FILE SCALE"):
            lora_args(None, [bad], False, False)


def test_real_smollm2_adapter_matches_llama_cpp(smollm2_f32: Path, tmp_path: Path) -> None:
    """A random GGUF adapter (q, v, down; alpha 32 over rank 8) on SmolLM2-135M at scale
    0.5: llama.cpp's logits with the same adapter."""
    import gguf

    adapter = tmp_path / "smollm2-lora.gguf"
    rng = np.random.default_rng(5)
    w = gguf.GGUFWriter(str(adapter), "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 32.0)
    m = frink_cli.load(smollm2_f32, lora=())
    shapes = {"attn_q": (576, 576), "attn_v": (192, 576), "ffn_down": (576, 1536)}
    for layer in range(m.config.n_layer):
        for t, (rows, cols) in shapes.items():
            for part, shape in (("lora_a", (8, cols)), ("lora_b", (rows, 8))):
                data = (rng.standard_normal(shape) * 0.05).astype(np.float32)
                w.add_tensor(f"blk.{layer}.{t}.weight.{part}", data)
    write_out(w)
    ids = np.asarray(m.tokenize("The capital of France is"))
    want = _make_tiny.llama_cpp_logits(smollm2_f32, ids, lora=(adapter, 0.5))
    got = frink_cli.load(smollm2_f32, lora=[(adapter, 0.5)]).logits(ids)
    assert np.abs(got - want).max() < TOL
