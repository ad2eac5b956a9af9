"""Sparse-MoE architectures users run today: Qwen3 MoE (`qwen3moe`, e.g. Qwen3-30B-A3B) and
Qwen3.5 MoE (`qwen35moe`, e.g. Qwen3.5-35B-A3B), beyond plain parity.

Its shared checks (references, GGUF vs HF dir, greedy, converter, metal, cuda, truncation,
decorations) are its tests/conformance_table.py entry; here is only what is its own.

Why: test_conformance.py already holds frink's logits against transformers and llama.cpp on
the tiny models (every position, GGUF and HF dir, batched and step by step). What it cannot
see on its own:
  - the decode path after a batched prefill, checked against llama.cpp's own greedy decode
    (every step's logits and the chosen tokens);
  - that the HF reader gives exactly the converter's tensors and metadata, for the text
    model and for the multimodal wrapper (Qwen3_5MoeForConditionalGeneration);
  - the other spellings of a checkpoint: experts stored fused ([E, 2*ff, d], as transformers
    holds them) instead of one tensor per expert, `num_experts` instead of transformers'
    `num_local_experts`, norm_topk_prob off;
  - the refusals: Qwen3 MoE configs with dense layers (mlp_only_layers, decoder_sparse_step),
    which llama.cpp cannot load either, named as such.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from frink_subprocess import frink

import frink_cli
from frink_cli.archs import config_from_checkpoint, open_checkpoint
from frink_cli.errors import FrinkError
from frink_cli.formats import TensorInfo

REF_TOL = 2e-3


def _path(tiny_model: Callable, name: str, source: str) -> Path:
    tm = tiny_model(name)
    path = tm.gguf if source == "gguf" else tm.hf_dir
    if path is None:
        pytest.skip(f"{name}: no GGUF")
    return path


def _hf_copy(tiny_model: Callable, name: str, tmp_path: Path, **changes) -> Path:
    """A copy of the tiny model's HF dir with config.json keys changed (None deletes)."""
    dst = tmp_path / name
    shutil.copytree(tiny_model(name).hf_dir, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


# --- the HF reader against the converter --------------------------------------------------------


def test_qwen35moe_has_no_dense_ffn_width(tiny_model: Callable) -> None:
    """Qwen3.5 MoE configs have no intermediate_size and the converter writes no
    feed_forward_length; every layer is routed, so none is needed."""
    gg = open_checkpoint(_path(tiny_model, "qwen35moe", "gguf"))
    assert "qwen35moe.feed_forward_length" not in gg.metadata
    cfg = config_from_checkpoint(gg)
    assert cfg.n_ff == 0 and all(cfg.ext.moe.layers)
    assert (
        cfg.ext.moe.n_expert,
        cfg.ext.moe.n_expert_used,
        cfg.ext.moe.n_ff_exp,
        cfg.ext.moe.n_ff_shexp,
    ) == (
        8,
        3,
        32,
        48,
    )


def test_fused_expert_tensors_read_like_per_expert_ones(
    tiny_model: Callable, tmp_path: Path
) -> None:
    """The same weights with the experts stored fused (mlp.experts.gate_up_proj [E, 2*ff, d],
    down_proj [E, d, ff], as transformers holds them in memory) give transformers' logits."""
    from safetensors.numpy import load_file, save_file

    src = tiny_model("qwen35moe_vl").hf_dir
    dst = tmp_path / "fused"
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    per_expert: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for name in [n for n in tensors if ".mlp.experts." in n]:
        prefix, rest = name.split(".mlp.experts.")
        e, kind, _ = rest.split(".")
        per_expert.setdefault(prefix, {}).setdefault(int(e), {})[kind] = tensors.pop(name)
    for prefix, experts in per_expert.items():
        order = range(len(experts))
        tensors[f"{prefix}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([experts[e]["gate_proj"], experts[e]["up_proj"]]) for e in order]
        )
        tensors[f"{prefix}.mlp.experts.down_proj"] = np.stack(
            [experts[e]["down_proj"] for e in order]
        )
    save_file(tensors, dst / "model.safetensors")

    tm = tiny_model("qwen35moe_vl")
    got = frink_cli.load(dst).logits([int(t) for t in tm.ref["tokens"]])
    assert np.abs(got - tm.ref["logits_hf"]).max() <= REF_TOL
    assert (got.argmax(-1) == tm.ref["logits_hf"].argmax(-1)).all()


# --- config spellings and what transformers does with them ----------------------------------------


def test_qwen3moe_num_experts_spellings(tiny_model: Callable, tmp_path: Path) -> None:
    """transformers saves num_local_experts; released Qwen3 MoE configs say num_experts."""
    saved = json.loads((tiny_model("qwen3moe").hf_dir / "config.json").read_text())
    assert "num_local_experts" in saved
    renamed = _hf_copy(
        tiny_model,
        "qwen3moe",
        tmp_path,
        num_local_experts=None,
        num_experts=saved["num_local_experts"],
    )
    a = config_from_checkpoint(open_checkpoint(tiny_model("qwen3moe").hf_dir))
    b = config_from_checkpoint(open_checkpoint(renamed))
    assert a == b and a.ext.moe.n_expert == 8


def test_qwen3moe_norm_topk_prob(tiny_model: Callable, tmp_path: Path) -> None:
    """transformers' Qwen3 MoE renormalizes the top-k router weights only with norm_topk_prob,
    which defaults to false; a GGUF has no such key and llama.cpp always renormalizes."""
    assert (
        config_from_checkpoint(open_checkpoint(tiny_model("qwen3moe").hf_dir)).ext.moe.norm_topk
        is True
    )
    assert (
        config_from_checkpoint(open_checkpoint(tiny_model("qwen3moe").gguf)).ext.moe.norm_topk
        is True
    )
    off = _hf_copy(tiny_model, "qwen3moe", tmp_path / "off", norm_topk_prob=False)
    unset = _hf_copy(tiny_model, "qwen3moe", tmp_path / "unset", norm_topk_prob=None)
    assert config_from_checkpoint(open_checkpoint(off)).ext.moe.norm_topk is False
    assert config_from_checkpoint(open_checkpoint(unset)).ext.moe.norm_topk is False
    # Qwen3.5 MoE's router always renormalizes.
    assert (
        config_from_checkpoint(open_checkpoint(tiny_model("qwen35moe").hf_dir)).ext.moe.norm_topk
        is True
    )


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"mlp_only_layers": [1]}, "mlp_only_layers"),
        ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ],
)
def test_qwen3moe_dense_layers_are_refused(
    tiny_model: Callable, tmp_path: Path, changes: dict, named: str
) -> None:
    with pytest.raises(FrinkError, match=named):
        open_checkpoint(_hf_copy(tiny_model, "qwen3moe", tmp_path, **changes))


class _Without:
    """A tensor source with some tensors hidden (a checkpoint missing them)."""

    def __init__(self, inner, hidden: set[str]) -> None:
        self.inner, self.hidden = inner, hidden

    def names(self) -> list[str]:
        return [n for n in self.inner.names() if n not in self.hidden]

    def info(self, name: str) -> TensorInfo:
        return self.inner.info(name)

    def load(self, name: str) -> np.ndarray:
        return self.inner.load(name)


@pytest.mark.parametrize("name", ["qwen3moe", "qwen35moe"])
def test_a_layer_without_a_router_is_refused(name: str, tiny_model: Callable) -> None:
    """llama.cpp's qwen3moe / qwen35moe need a router on every layer; a file with a dense
    layer is refused by name rather than run differently from llama.cpp."""
    ckpt = open_checkpoint(_path(tiny_model, name, "gguf"))
    hidden = dataclasses.replace(
        ckpt, tensors=_Without(ckpt.tensors, {"blk.1.ffn_gate_inp.weight"})
    )
    with pytest.raises(FrinkError, match=r"blk\.1\.ffn_gate_inp"):
        config_from_checkpoint(hidden)


def test_missing_expert_count_is_refused(tiny_model: Callable) -> None:
    ckpt = open_checkpoint(_path(tiny_model, "qwen35moe", "gguf"))
    del ckpt.metadata["qwen35moe.expert_count"]
    with pytest.raises(FrinkError, match="expert_count"):
        config_from_checkpoint(ckpt)


@pytest.mark.parametrize("value", [None, 0])
def test_a_dense_model_still_needs_its_ffn_width(tiny_model: Callable, value: int | None) -> None:
    """Only a model whose every FFN is routed may go without feed_forward_length."""
    ckpt = open_checkpoint(_path(tiny_model, "qwen3", "gguf"))
    if value is None:
        del ckpt.metadata["qwen3.feed_forward_length"]
    else:
        ckpt.metadata["qwen3.feed_forward_length"] = value
    with pytest.raises(FrinkError, match="feed_forward_length"):
        config_from_checkpoint(ckpt)


# --- what a user sees -----------------------------------------------------------------------------


def test_info_shows_the_pattern_and_the_experts(tiny_model: Callable) -> None:
    result = frink("info", _path(tiny_model, "qwen35moe", "gguf"))
    assert result.returncode == 0, result.describe()
    assert "layers:         8 (GDN x3 ATTN x1 (x2))" in result.stdout
    assert "experts:        8, top 3, expert ffn 32, shared expert ffn 48" in result.stdout
    assert "ffn routed" in result.stdout
    data = json.loads(frink("info", _path(tiny_model, "qwen3moe", "hf"), "--json").stdout)
    assert data["architecture"] == "qwen3moe"
    assert data["layer_pattern"] == "ATTN x3"
    assert data["moe"] == {
        "layers": 3,
        "experts": 8,
        "experts_used": 3,
        "expert_ff": 32,
        "shared_ff": 0,
        "parallel_dense": False,
        "norm_topk": True,
        "gating": "softmax",
        "expert_bias": False,
        "weights_scale": 1.0,
    }
    assert [entry["ffn"] for entry in data["layers"]] == ["moe"] * 3
