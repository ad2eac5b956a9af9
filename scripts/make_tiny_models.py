"""Tiny random models + third-party reference logits: the fixtures every parity test uses.

Why this exists: frink's numbers are only trusted when they match someone else's. For each
architecture we build a small random model with transformers (seeded, f32), save it as an HF
safetensors directory, convert it with llama.cpp's own converter, and record what
transformers and llama.cpp compute for one fixed token sequence. Tests then compare frink
against those two, never against frink itself.

Weights are drawn wider than HF's default init (std 0.1 instead of 0.02), and norm weights,
biases and QK norms are all randomized, so every decoration moves the logits: a dropped
bias or an unshifted gemma norm shows up as a large error rather than a 1e-4 one.

Layout written per model:   OUT_DIR/<name>/hf/          (config.json, model.safetensors)
                            OUT_DIR/<name>/model.gguf   (absent if llama.cpp can't convert it)
                            OUT_DIR/<name>/ref.npz      tokens, logits_hf, [logits_llamacpp,
                                                        max_abs_diff_hf_llamacpp]
                            OUT_DIR/<name>/stamp.json   script version + spec; written last

The specs (which models, their configs and how their weights are drawn) are data, in
scripts/tiny_specs.py; this script is the machinery that builds them.

Usage: python scripts/make_tiny_models.py OUT_DIR [--only name ...]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_cpp_converter
from tiny_specs import (
    GREEDY_PROMPT,
    NORM_STD,
    SEQ_LEN,
    SPECS,
    WEIGHT_STD,
    TinySpec,
)

# Bump when anything that changes the outputs changes (specs, init, reference settings).
SCRIPT_VERSION = 2
TOKEN_SEED = 1234
# 5x the parity tolerance (2e-3): no position's argmax may hinge on summation noise.
MIN_TOP2_GAP = 1e-2
N_CTX = 64

MODEL_NAMES: tuple[str, ...] = tuple(SPECS)

# Spec fields added after version 2; left out of a fingerprint while at their defaults, so
# adding them did not invalidate every existing fixture.
_LATER_FIELDS = {
    "seq_len": SEQ_LEN,
    "convert_args": [],
    "vector_overrides": {},
    "greedy": 0,
    "greedy_prompt": GREEDY_PROMPT,
    "min_router_gap": 0.0,
    "convert_architecture": "",
    "ternary": [],
    "convert_renames": {},
    "router_bias_std": 0.0,
    "config_overrides": {},
    "matrix_std": {},
    "buffer_overrides": {},
    "convert_drop": [],
}


def _spec_fingerprint(spec: TinySpec) -> dict[str, Any]:
    d = json.loads(json.dumps(asdict(spec)))
    for key, default in _LATER_FIELDS.items():
        if d.get(key) == default:
            d.pop(key, None)
    return {"script_version": SCRIPT_VERSION, "spec": d}


def fixture_tokens(seed: int = TOKEN_SEED, length: int = SEQ_LEN, vocab: int = 512) -> np.ndarray:
    """A seeded token sequence (the fixture's is the first seed with clear argmaxes)."""
    return (
        np.random.default_rng(seed).integers(0, vocab, size=length, dtype=np.int64).astype(np.int32)
    )


def _randomize(model: Any, spec: TinySpec) -> None:
    import torch

    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied tensors are listed once
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            override = next((cs for key, cs in spec.vector_overrides.items() if key in name), None)
            if p.ndim >= 2 and any(key in name for key in spec.ternary):
                mag = torch.rand((), generator=gen) * WEIGHT_STD + WEIGHT_STD / 2
                c = mag.to(torch.float16).to(torch.float32)
                p.copy_(torch.where(noise >= 0, c, -c))
            elif p.ndim >= 2:
                std = next((v for key, v in spec.matrix_std.items() if key in name), WEIGHT_STD)
                p.copy_(noise * std)
            elif override is not None:
                p.copy_(override[0] + noise * override[1])
            elif "norm" in name:
                center = next(
                    (c for key, c in spec.norm_center_overrides.items() if key in name),
                    spec.norm_center,
                )
                p.copy_(center + noise * NORM_STD)
            else:  # biases
                p.copy_(noise * WEIGHT_STD)
        for name, b in model.named_buffers():
            cs = next((v for key, v in spec.buffer_overrides.items() if key in name), None)
            if cs is not None:
                noise = torch.randn(b.shape, generator=gen, dtype=torch.float32)
                b.copy_(cs[0] + noise * cs[1])
        if spec.router_bias_std:
            for name, b in model.named_buffers():
                if name.endswith("expert_bias"):
                    noise = torch.randn(b.shape, generator=gen, dtype=torch.float32)
                    b.copy_(noise * spec.router_bias_std)


def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def _build_hf(spec: TinySpec, hf_dir: Path) -> None:
    import torch
    import transformers

    _quiet_transformers()
    torch.manual_seed(spec.seed)
    config = getattr(transformers, spec.config_class)(**spec.config)
    cls = getattr(transformers, spec.hf_class)
    model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    _randomize(model, spec)
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    model.save_pretrained(hf_dir)
    if spec.config_overrides:
        cfg_path = hf_dir / "config.json"
        cfg_path.write_text(
            json.dumps(dict(json.loads(cfg_path.read_text()), **spec.config_overrides), indent=2)
        )


def _load_hf(spec: TinySpec, hf_dir: Path) -> Any:
    """The model as reloaded from the *saved* directory, so references are what the files hold."""
    import torch
    import transformers

    cls = getattr(transformers, spec.hf_class)
    model = cls.from_pretrained(hf_dir, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


def _hf_logits(model: Any, tokens: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(tokens.astype(np.int64))[None, :], use_cache=False)
    return out.logits[0].to(torch.float32).numpy().copy()


def min_top2_gap(logits: np.ndarray) -> float:
    """Smallest margin between the best and second-best logit over all positions."""
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return float(np.min(top2[:, 1] - top2[:, 0]))


def _min_router_gap(model: Any, spec: TinySpec, tokens: np.ndarray) -> float:
    """Smallest margin between the k-th and (k+1)-th router score, over layers and positions.
    The score is the router logit, or, for a sigmoid router with an expert bias (lfm2moe),
    sigmoid(logit) + bias: what the top k is taken over."""
    import torch

    text = _text_config(spec)
    k = int(text.get("num_experts_per_tok") or text["top_k_experts"])  # gemma4: top_k_experts
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(tokens.astype(np.int64))[None, :],
            use_cache=False,
            output_router_logits=True,
        )
    biases = [b.numpy() for n, b in model.named_buffers() if n.endswith("expert_bias")]
    gaps = []
    for i, r in enumerate(out.router_logits):  # one [T, n_expert] per routed layer
        scores = r.to(torch.float32).numpy().reshape(-1, r.shape[-1])
        if biases:
            scores = 1.0 / (1.0 + np.exp(-scores.astype(np.float64))) + biases[i]
        top = np.sort(scores, axis=-1)[:, ::-1]
        gaps.append(float(np.min(top[:, k - 1] - top[:, k])))
    return min(gaps)


def _hf_greedy_path(model: Any, prompt: np.ndarray, n_new: int) -> tuple[np.ndarray, float]:
    """transformers' greedy continuation: (the prompt and the chosen tokens less the last,
    which no step reads -- the tokens every decode step's router sees; the smallest top-2
    margin among the n_new choices)."""
    tokens, gap = prompt, np.inf
    for i in range(n_new):
        last = _hf_logits(model, tokens)[-1:]
        gap = min(gap, min_top2_gap(last))
        if i < n_new - 1:
            tokens = np.append(tokens, np.int32(last.argmax()))
    return tokens, float(gap)


def _pick_tokens(spec: TinySpec, model: Any) -> tuple[int, np.ndarray, np.ndarray]:
    # Tests demand the same argmax as the references at every position, which is only fair
    # where the reference's top two are further apart than the tolerance. Walk the token seed
    # (deterministically) until every position has a clear winner (and, for MoE specs, every
    # routing decision a clear margin).
    for seed in range(TOKEN_SEED, TOKEN_SEED + 200):
        tokens = fixture_tokens(seed=seed, length=spec.seq_len, vocab=_vocab_size(spec))
        logits = _hf_logits(model, tokens)
        if min_top2_gap(logits) < MIN_TOP2_GAP:
            continue
        if spec.min_router_gap:
            if _min_router_gap(model, spec, tokens) < spec.min_router_gap:
                continue
            if spec.greedy:
                path, gap = _hf_greedy_path(model, tokens[: spec.greedy_prompt], spec.greedy)
                if gap < MIN_TOP2_GAP or _min_router_gap(model, spec, path) < spec.min_router_gap:
                    continue
        return seed, tokens, logits
    raise RuntimeError(f"{spec.name}: no token sequence with a top-2 margin >= {MIN_TOP2_GAP}")


_LOG_CALLBACK: Any = None


@contextlib.contextmanager
def _llama_context(
    gguf_path: Path,
    n_ctx: int,
    n_threads: int = 2,
    n_ubatch: int | None = None,
    lora: tuple[Path, float] | None = None,
    cache_type: int = 0,
    load_mtp: bool = False,
) -> Iterator[tuple[Any, Any, int]]:
    """(llama_cpp module, context, n_vocab) for one sequence: f32 KV cache (or the ggml type
    cache_type: 1 is f16), no flash attention, one ubatch of up to n_ctx tokens (llama.cpp's
    batched paths, like frink's), or of n_ubatch (1: only single-row graphs are ever built,
    reservation included).
    lora: a GGUF LoRA adapter and its scale, set on the context (llama.cpp's --lora-scaled).

    The low-level API is used because the high-level Llama class expects a vocabulary and
    these models have tokenizer model "none".
    """
    global _LOG_CALLBACK
    import llama_cpp as L

    if _LOG_CALLBACK is None:
        # Keep the ctypes callback alive for the life of the process; llama.cpp holds it.
        _LOG_CALLBACK = L.llama_log_callback(lambda level, text, user_data: None)
        L.llama_log_set(_LOG_CALLBACK, None)
        L.llama_backend_init()

    mparams = L.llama_model_default_params()
    mparams.n_gpu_layers = 0
    # No extra CPU buffer types (AMX, weight repacking): the reference is ggml's plain CPU
    # path. Its AMX buffers crash decoding these tiny Q8_0 files on a CPU with AMX (a
    # Sapphire Rapids runner: segfault in the lfm2 Q8_0 run), and the plain path is the
    # same on every machine.
    mparams.use_extra_bufts = False
    mparams.load_mtp = load_mtp  # the NextN blocks, for an MTP context (llama_cpp_mtp)
    model = L.llama_model_load_from_file(str(gguf_path).encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {gguf_path}")
    ctx = None
    try:
        params = _context_params(L, n_ctx, n_threads, n_ubatch, cache_type)
        ctx = L.llama_init_from_model(model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {gguf_path}")
        if lora is not None:
            adapter = L.llama_adapter_lora_init(model, str(lora[0]).encode())
            if not adapter:
                raise RuntimeError(f"llama.cpp could not load the LoRA adapter {lora[0]}")
            adapters = (L.llama_adapter_lora_p_ctypes * 1)(adapter)
            scales = (ctypes.c_float * 1)(lora[1])
            if L.llama_set_adapters_lora(ctx, adapters, 1, scales) != 0:
                raise RuntimeError(f"llama.cpp could not set the LoRA adapter {lora[0]}")
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        if n_vocab <= 0:
            raise RuntimeError(f"{gguf_path}: llama.cpp sees no vocab (vocab_size key missing?)")
        yield L, ctx, n_vocab
    finally:
        if ctx:
            L.llama_free(ctx)
        L.llama_model_free(model)


def _context_params(
    L: Any, n_ctx: int, n_threads: int, n_ubatch: int | None, cache_type: int = 0
) -> Any:
    """One sequence's context settings: f32 KV cache (or ggml type cache_type), no flash
    attention, one ubatch."""
    cparams = L.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_ubatch or n_ctx
    cparams.n_ubatch = n_ubatch or n_ctx
    cparams.n_seq_max = 1
    cparams.n_threads = n_threads
    cparams.n_threads_batch = n_threads
    # GGML_TYPE_F32 by default: no f16 rounding of the cache in the reference.
    cparams.type_k = cache_type
    cparams.type_v = cache_type
    cparams.flash_attn_type = 0  # disabled: the plain softmax path, all in f32
    cparams.offload_kqv = False
    return cparams


def _llama_decode(L: Any, ctx: Any, n_vocab: int, tokens: list[int], start: int) -> np.ndarray:
    """Feed tokens at positions start.. as one batch; their logits [len(tokens), n_vocab]."""
    n = len(tokens)
    batch = L.llama_batch_init(n, 0, 1)
    try:
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        batch.n_tokens = n
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        out = np.empty((n, n_vocab), dtype=np.float32)
        for i in range(n):
            out[i] = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
        return out
    finally:
        L.llama_batch_free(batch)


def llama_cpp_logits(
    gguf_path: Path,
    tokens: np.ndarray,
    n_threads: int = 2,
    lora: tuple[Path, float] | None = None,
    cache_type: int = 0,
) -> np.ndarray:
    """All-position logits from llama.cpp for one batch (with a LoRA adapter: `lora`; K/V
    caches of ggml type `cache_type`)."""
    n_ctx = max(N_CTX, len(tokens))
    context = _llama_context(gguf_path, n_ctx, n_threads, lora=lora, cache_type=cache_type)
    with context as (L, ctx, n_vocab):
        return _llama_decode(L, ctx, n_vocab, [int(t) for t in tokens], 0)


def llama_cpp_step_logits(gguf_path: Path, tokens: np.ndarray, n_threads: int = 2) -> np.ndarray:
    """All-position logits from llama.cpp fed one token per decode (its single-row paths),
    for graphs its batched path cannot run (mpt's QK LayerNorm reshapes a strided view)."""
    n_ctx = max(N_CTX, len(tokens))
    with _llama_context(gguf_path, n_ctx, n_threads, n_ubatch=1) as (L, ctx, n_vocab):
        return np.concatenate(
            [_llama_decode(L, ctx, n_vocab, [int(t)], i) for i, t in enumerate(tokens)]
        )


def llama_cpp_greedy(
    gguf_path: Path,
    prompt: np.ndarray,
    n_new: int,
    n_threads: int = 2,
    batch_prompt: bool = True,
    lora: tuple[Path, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's greedy continuation of `prompt`: the prompt as one batch (or, without
    batch_prompt, a token at a time), then one decode step per token (its single-row paths,
    e.g. the recurrent step of a delta net). Returns (the n_new chosen tokens, the logits
    each was chosen from [n_new, n_vocab]). lora: an adapter and its scale."""
    n_ctx = max(N_CTX, len(prompt) + n_new)
    n_ubatch = None if batch_prompt else 1
    with _llama_context(gguf_path, n_ctx, n_threads, n_ubatch, lora) as (L, ctx, n_vocab):
        ids = [int(t) for t in prompt]
        if batch_prompt:
            last = _llama_decode(L, ctx, n_vocab, ids, 0)[-1]
        else:
            for i, t in enumerate(ids):
                last = _llama_decode(L, ctx, n_vocab, [t], i)[0]
        chosen, logits = [], []
        for i in range(n_new):
            logits.append(last)
            chosen.append(int(np.argmax(last)))
            last = _llama_decode(L, ctx, n_vocab, [chosen[-1]], len(prompt) + i)[0]
        return np.asarray(chosen, dtype=np.int32), np.stack(logits)


def llama_cpp_reference(
    gguf_path: Path, tokens: np.ndarray, greedy_prompt: np.ndarray, n_greedy: int
) -> dict[str, np.ndarray]:
    """What ref.npz holds for a file llama.cpp alone judges: the tokens' logits as one
    batch, and its greedy run of n_greedy tokens after greedy_prompt with the logits each
    token was chosen from."""
    chosen, step_logits = llama_cpp_greedy(gguf_path, greedy_prompt, n_greedy)
    return {
        "tokens": tokens,
        "logits_llamacpp": llama_cpp_logits(gguf_path, tokens),
        "greedy_prompt": greedy_prompt,
        "greedy_llamacpp": chosen,
        "greedy_logits_llamacpp": step_logits,
    }


def is_up_to_date(model_dir: Path, spec: TinySpec) -> bool:
    stamp = model_dir / "stamp.json"
    if not stamp.is_file() or not (model_dir / "ref.npz").is_file():
        return False
    try:
        data = json.loads(stamp.read_text())
    except json.JSONDecodeError:
        return False
    if {k: data.get(k) for k in ("script_version", "spec")} != _spec_fingerprint(spec):
        return False
    return not data.get("gguf") or (model_dir / "model.gguf").is_file()


def make_one(spec: TinySpec, out_dir: Path, force: bool = False) -> dict[str, Any]:
    """Build one model's fixtures (or reuse them); return its stamp.

    The fixture is built in a directory of its own and renamed into place whole, so a
    build killed half way (a test timeout) never leaves a half fixture for another run."""
    model_dir = out_dir / spec.name
    if not force and is_up_to_date(model_dir, spec):
        return json.loads((model_dir / "stamp.json").read_text())
    work = out_dir / f".{spec.name}.{os.getpid()}.building"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        stamp = _build_into(spec, work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    _swap_in(work, model_dir)
    return stamp


def _swap_in(work: Path, model_dir: Path) -> None:
    """Put the built directory `work` where `model_dir` is, whatever stood there before."""
    old = work.with_name(work.name.replace(".building", ".old"))
    for _ in range(5):
        if model_dir.exists():
            shutil.rmtree(old, ignore_errors=True)
            model_dir.rename(old)
        try:
            work.rename(model_dir)
            break
        except OSError:  # another build put its copy in place meanwhile: move it aside
            continue
    shutil.rmtree(old, ignore_errors=True)


def _build_into(spec: TinySpec, model_dir: Path) -> dict[str, Any]:
    """Build one model's fixtures into the empty directory `model_dir`; return its stamp."""
    t0 = time.perf_counter()
    hf_dir = model_dir / "hf"
    gguf_path = model_dir / "model.gguf"

    _build_hf(spec, hf_dir)
    token_seed, tokens, logits_hf = _pick_tokens(spec, _load_hf(spec, hf_dir))
    ref: dict[str, np.ndarray] = {"tokens": tokens, "logits_hf": logits_hf}

    convert_error = None
    if spec.convert_architecture:
        cfg_path = hf_dir / "config.json"
        hf_cfg = json.loads(cfg_path.read_text())
        hf_cfg["architectures"] = [spec.convert_architecture]
        cfg_path.write_text(json.dumps(hf_cfg, indent=2) + "\n")
    convert_dir = _renamed_copy(spec, hf_dir, model_dir / "hf_convert")
    try:
        llama_cpp_converter.convert(
            convert_dir,
            gguf_path,
            outtype="f32",
            model_name=spec.name,
            extra_args=spec.convert_args,
        )
    except RuntimeError as exc:
        convert_error = str(exc).splitlines()[0] + " ... " + str(exc).strip().splitlines()[-1]
        gguf_path.unlink(missing_ok=True)
        if spec.expect_gguf:
            raise
    finally:
        if convert_dir != hf_dir:
            shutil.rmtree(convert_dir, ignore_errors=True)
    max_diff = None
    argmax_agree = None
    if convert_error is None:
        logits_cpp = llama_cpp_logits(gguf_path, tokens)
        max_diff = float(np.max(np.abs(logits_cpp - logits_hf)))
        argmax_agree = bool(np.array_equal(logits_cpp.argmax(-1), logits_hf.argmax(-1)))
        ref["logits_llamacpp"] = logits_cpp
        ref["max_abs_diff_hf_llamacpp"] = np.float32(max_diff)
        if spec.greedy:
            prompt = tokens[: spec.greedy_prompt]
            chosen, step_logits = llama_cpp_greedy(gguf_path, prompt, spec.greedy)
            ref["greedy_prompt"] = prompt
            ref["greedy_llamacpp"] = chosen
            ref["greedy_logits_llamacpp"] = step_logits
    ref["min_top2_gap"] = np.float32(min_top2_gap(logits_hf))
    np.savez(model_dir / "ref.npz", **ref)

    stamp = dict(
        _spec_fingerprint(spec),
        gguf=convert_error is None,
        convert_error=convert_error,
        max_abs_diff_hf_llamacpp=max_diff,
        argmax_hf_equals_llamacpp=argmax_agree,
        token_seed=token_seed,
        min_top2_gap=float(ref["min_top2_gap"]),
        logits_std=float(logits_hf.std()),
        seconds=round(time.perf_counter() - t0, 2),
    )
    (model_dir / "stamp.json").write_text(json.dumps(stamp, indent=2) + "\n")
    return stamp


def _renamed_copy(spec: TinySpec, hf_dir: Path, dst: Path) -> Path:
    """hf_dir itself, or (spec.convert_renames, spec.convert_drop) a copy whose parameters
    are renamed and the named buffers left out."""
    if not spec.convert_renames and not spec.convert_drop:
        return hf_dir
    from safetensors.numpy import load_file, save_file

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(hf_dir, dst)
    for st in dst.glob("*.safetensors"):
        tensors = load_file(st)
        renamed = {}
        for name, t in tensors.items():
            if any(key in name for key in spec.convert_drop):
                continue
            for old, new in spec.convert_renames.items():
                name = name.replace(old, new)
            renamed[name] = t
        save_file(renamed, st, metadata={"format": "pt"})
    return dst


def _text_config(spec: TinySpec) -> dict[str, Any]:
    return spec.config.get("text_config", spec.config)


def _vocab_size(spec: TinySpec) -> int:
    return int(_text_config(spec)["vocab_size"])


def make_all(out_dir: Path, only: list[str] | None = None, force: bool = False) -> dict[str, Any]:
    names = only or list(MODEL_NAMES)
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        raise SystemExit(f"unknown tiny model(s): {', '.join(unknown)}; known: {', '.join(SPECS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    # Two pytest runs sharing a cache (FRINK_TEST_CACHE) would otherwise build the same
    # fixture into the same folder at once and read each other's half-written files: the
    # second waits here, then finds everything up to date.
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return {name: make_one(SPECS[name], out_dir, force=force) for name in names}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Make tiny random models and reference logits.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"subset of {list(SPECS)}")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    # Two threads like the CI runner; more only adds noise to tiny matmuls.
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    stamps = make_all(args.out_dir, args.only, args.force)
    for name, st in stamps.items():
        if st["gguf"]:
            msg = f"max|hf - llama.cpp| = {st['max_abs_diff_hf_llamacpp']:.3g}"
            if not st["argmax_hf_equals_llamacpp"]:
                msg += " ARGMAX DIFFERS"
        else:
            msg = f"no GGUF ({st['convert_error']})"
        print(
            f"{name:12s} logits std {st['logits_std']:.3f}  min top-2 gap "
            f"{st['min_top2_gap']:.3g}  {msg}  [{st['seconds']}s]"
        )


if __name__ == "__main__":
    main()
