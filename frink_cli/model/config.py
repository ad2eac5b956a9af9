"""ModelConfig: the globals of a model and every decoration, read from canonical metadata.

The decoder is one loop over layers; what differs between architectures is data. Each
decoration llama.cpp's graph builders apply (QK norm, post norms, GeGLU, embedding scale,
sliding windows with their own rope base, logit softcap...) is an explicit field here,
filled from the GGUF keys and the per-architecture table in configs/architectures.json.
`layer_shape(l)` says what layer l is, so the host body and every backend ask one place.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import FrinkError
from ..formats import Checkpoint
from ..resources import config_file
from .validate import validate_config



@lru_cache(maxsize=1)
def architecture_table() -> dict[str, dict[str, Any]]:
    raw = json.loads(config_file("architectures.json").read_text())
    defaults = raw["_defaults"]

    def entry(name: str) -> dict[str, Any]:
        # "extends": a variant (qwen3moe of qwen3) is its base's decorations plus its own.
        own = {k: v for k, v in raw[name].items() if k != "extends"}
        base = entry(raw[name]["extends"]) if "extends" in raw[name] else defaults
        return {**base, **own}

    return {k: entry(k) for k in raw if not k.startswith("_")}


def supported_architectures() -> list[str]:
    return sorted(architecture_table())


@dataclass(frozen=True)
class LayerShape:
    """What layer l is. Backends decide eligibility from this alone."""

    mixer: str  # "attention" | "gdn" (gated delta net: linear attention with recurrent state)
    ffn: str  # "dense" | "moe" (sparse mixture of experts)
    window: int | None  # sliding-window width (keys q - k < window are visible), None = full
    rope_base: float
    rope_scale: float  # position multiplier (1 / linear scaling factor)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    rope_type: str  # "norm" (adjacent pairs, llama) | "neox" (halves)
    rope_dim: int  # leading dims of each head that rotate
    rope_base: float
    rope_scale: float
    rope_base_swa: float
    attn_scale: float  # multiplies q before q.k
    sliding_window: int | None
    swa_layers: tuple[bool, ...]
    ffn_act: str  # "silu" | "gelu_tanh"
    qk_norm: bool
    post_attn_norm: bool
    post_ffn_norm: bool
    embd_scale: float | None
    final_logit_softcap: float | None
    attn_logit_softcap: float | None
    tied_embeddings: bool
    has_rope_freqs: bool  # per-dimension frequency factors (llama 3.x "rope_freqs.weight")
    # Where the pre-FFN norm is stored: qwen35/qwen3next name it post_attention_norm.
    ffn_norm_tensor: str = "ffn_norm"
    # The query projection also yields a per-head gate: out *= sigmoid(gate) before o_proj.
    # Its rows interleave per head, [q_h (head_dim), gate_h (head_dim)], as HF and GGUF store them.
    attn_output_gate: bool = False
    # Hybrid recurrent models (qwen35, qwen3next): gated delta net (GDN) layers.
    recurrent_layers: tuple[bool, ...] = ()  # per layer: GDN instead of attention; () = none
    ssm_conv_kernel: int = 0  # width of the causal depthwise conv over q/k/v
    ssm_n_k_heads: int = 0  # ssm.group_count
    ssm_n_v_heads: int = 0  # ssm.time_step_rank
    ssm_head_dim_k: int = 0  # ssm.state_size
    ssm_head_dim_v: int = 0  # ssm.inner_size / n_v_heads
    # Which key head value head h reads when n_v > n_k: "tiled" h % n_k (qwen35 GGUFs: the
    # converter reorders value heads for ggml's broadcast) or "grouped" h // (n_v / n_k).
    ssm_v_head_order: str = "grouped"
    # Sparse MoE FFN (qwen3moe, qwen3next, qwen35moe): per layer whether the FFN is routed; () = none.
    moe_layers: tuple[bool, ...] = ()
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0  # shared expert width (always on, sigmoid-gated); 0 = none
    moe_norm_topk: bool = True  # renormalize the top-k router probabilities to sum to 1

    def is_recurrent(self, layer: int) -> bool:
        return bool(self.recurrent_layers) and self.recurrent_layers[layer]

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the conv (and its state): q, k (n_k heads each) and v (n_v heads)."""
        return 2 * self.ssm_n_k_heads * self.ssm_head_dim_k + self.ssm_n_v_heads * self.ssm_head_dim_v

    def gdn_key_heads(self) -> list[int]:
        """Per value head, the key head it reads (the host body and every backend ask here)."""
        n_k, n_v = self.ssm_n_k_heads, self.ssm_n_v_heads
        if self.ssm_v_head_order == "tiled":
            return [h % n_k for h in range(n_v)]
        return [h // (n_v // n_k) for h in range(n_v)]

    def recurrent_state_bytes(self) -> int:
        """f32 bytes of recurrent state one sequence holds: conv tail + delta state per GDN layer."""
        per_layer = (self.ssm_conv_kernel - 1) * self.ssm_conv_dim + (
            self.ssm_n_v_heads * self.ssm_head_dim_k * self.ssm_head_dim_v
        )
        return 4 * per_layer * sum(self.recurrent_layers)

    def layer_shape(self, layer: int) -> LayerShape:
        swa = self.swa_layers[layer]
        return LayerShape(
            mixer="gdn" if self.is_recurrent(layer) else "attention",
            ffn="moe" if self.moe_layers and self.moe_layers[layer] else "dense",
            window=self.sliding_window if swa else None,
            rope_base=self.rope_base_swa if swa else self.rope_base,
            rope_scale=1.0 if swa else self.rope_scale,
        )

    def layer_pattern(self) -> str:
        """A compact summary such as 'SWA x5 ATTN x1 (x3)' or 'GDN x3 ATTN x1 (x6)'."""
        names = [
            "GDN" if self.is_recurrent(i) else "SWA" if self.swa_layers[i] else "ATTN"
            for i in range(self.n_layer)
        ]
        runs: list[tuple[str, int]] = []
        for n in names:
            if runs and runs[-1][0] == n:
                runs[-1] = (n, runs[-1][1] + 1)
            else:
                runs.append((n, 1))
        # The shortest group of runs that repeats to make the whole stack, shown once.
        for period in range(1, len(runs)):
            if len(runs) % period == 0 and runs == runs[:period] * (len(runs) // period):
                group = " ".join(f"{n} x{c}" for n, c in runs[:period])
                return f"{group} (x{len(runs) // period})"
        return " ".join(f"{n} x{c}" for n, c in runs)


def _get(md: dict[str, Any], key: str, default: Any = None, *, required: bool = False) -> Any:
    if key in md:
        return md[key]
    if required:
        raise FrinkError(f"model metadata is missing {key}")
    return default


def _per_layer_int(value: Any, n_layer: int, key: str, skip_zero: bool = False) -> int:
    """GGUF allows per-layer arrays for head counts; frink's dense graph needs one value.

    skip_zero: hybrid models may write 0 for their recurrent layers, which have no heads.
    """
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        vals = {int(v) for v in list(value) if not (skip_zero and int(v) == 0)}
        if len(vals) != 1:
            raise FrinkError(f"{key} varies per layer ({sorted(vals)}), which frink does not support")
        return vals.pop()
    return int(value)


def config_from_checkpoint(ckpt: Checkpoint) -> ModelConfig:
    try:
        cfg = _config_from_checkpoint(ckpt)
    except (ValueError, TypeError, ArithmeticError) as e:
        # Metadata of the wrong type (a string where a count belongs, an array where a
        # scalar does) is a corrupt file, not a bug: name the file and the complaint.
        raise FrinkError(f"{ckpt.path}: bad model metadata ({e})") from e
    validate_config(cfg, str(ckpt.path), ckpt)
    return cfg


def _config_from_checkpoint(ckpt: Checkpoint) -> ModelConfig:
    md = ckpt.metadata
    arch = ckpt.arch
    table = architecture_table()
    if arch not in table:
        raise FrinkError(
            f"{ckpt.path}: unknown architecture {arch!r} (frink supports: {', '.join(supported_architectures())})"
        )
    a = table[arch]

    def key(name: str) -> str:
        return f"{arch}.{name}"

    # block_count includes any multi-token-prediction (NextN) blocks stored after the trunk;
    # like llama.cpp's main pass, frink runs the trunk only.
    n_layer = int(_get(md, key("block_count"), required=True)) - int(_get(md, key("nextn_predict_layers"), 0))
    n_embd = int(_get(md, key("embedding_length"), required=True))
    hybrid = bool(a["gdn"])
    n_head = _per_layer_int(_get(md, key("attention.head_count"), required=True), n_layer, "head_count", hybrid)
    n_head_kv = _per_layer_int(_get(md, key("attention.head_count_kv"), n_head), n_layer, "head_count_kv", hybrid)
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise FrinkError(f"bad head counts: {n_head} query heads, {n_head_kv} KV heads")
    head_dim_k = int(_get(md, key("attention.key_length"), n_embd // n_head))
    head_dim_v = int(_get(md, key("attention.value_length"), head_dim_k))
    # A model whose every FFN is routed (qwen35moe) may have no dense FFN width at all;
    # 0 here, and required below only if some layer is dense.
    n_ff = _per_layer_int(_get(md, key("feed_forward_length"), 0), n_layer, "feed_forward_length")

    names = set(ckpt.tensors.names())
    # Every layer holds at least one tensor, so a block count above the tensor count is a
    # corrupt header; checking here keeps per-layer lists (swa_layers, info) from
    # allocating billions of entries.
    if not 0 < n_layer <= len(names):
        raise FrinkError(f"{ckpt.path}: block_count {n_layer} does not fit the file's {len(names)} tensors")
    # feed_forward_length may be 0 (or absent) where every FFN is routed: checked below.
    sizes = {"embedding_length": n_embd, "attention.key_length": head_dim_k,
             "attention.value_length": head_dim_v, "feed_forward_length": n_ff or 1}
    for what, value in sizes.items():
        if value <= 0:
            raise FrinkError(f"{ckpt.path}: bad model metadata ({arch}.{what} = {value})")
    if "token_embd.weight" not in names:
        raise FrinkError(f"{ckpt.path}: no token_embd.weight tensor")
    n_vocab = ckpt.tensors.info("token_embd.weight").shape[0]

    # Linear rope scaling only; other schemes change the frequencies in ways not carried yet.
    scaling_type = str(_get(md, key("rope.scaling.type"), "none"))
    factor = float(_get(md, key("rope.scaling.factor"), 0.0) or 0.0)
    if scaling_type not in ("none", "linear") and factor not in (0.0, 1.0):
        raise FrinkError(f"rope scaling type {scaling_type!r} is not supported")
    rope_scale = 1.0 / factor if factor > 0 else 1.0

    sliding_window = _get(md, key("attention.sliding_window"))
    sliding_window = int(sliding_window) if sliding_window else None
    swa_layers = [False] * n_layer
    if sliding_window:
        pattern = _get(md, key("attention.sliding_window_pattern"), a["swa_pattern"])
        if isinstance(pattern, (list, tuple)) or hasattr(pattern, "tolist"):
            swa_layers = [bool(x) for x in list(pattern)][:n_layer]
            if len(swa_layers) != n_layer:
                raise FrinkError(f"sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
        else:
            # llama.cpp's rule: in each group of n layers, all but the last use the window.
            n = int(pattern or 0)
            swa_layers = [n == 0 or (i % n < n - 1) for i in range(n_layer)]

    if a["attn_scale_rule"] == "gemma3" and n_layer == 62:
        # Gemma 3 27B scales by n_embd / n_head (its query_pre_attn_scalar), as llama.cpp does.
        default_scale = 1.0 / math.sqrt(n_embd / n_head)
    else:
        default_scale = 1.0 / math.sqrt(head_dim_k)
    attn_scale = float(_get(md, key("attention.scale"), default_scale))

    embd_scale = math.sqrt(n_embd) if a["embd_scale"] == "sqrt_n_embd" else None

    def positive_or_none(v: Any) -> float | None:
        return float(v) if v else None

    if a["attn_output_gate"] and head_dim_k != head_dim_v:
        # The gate has one value per query dim and multiplies the attention output per dim.
        raise FrinkError(f"{ckpt.path}: gated attention needs key_length == value_length ({head_dim_k} != {head_dim_v})")
    rope_dim = int(_get(md, key("rope.dimension_count"), head_dim_k))
    if a["rope_sections"] == "imrope":
        _check_imrope_sections(_get(md, key("rope.dimension_sections")), rope_dim, ckpt)
    hybrid_fields = _hybrid_fields(ckpt, a, n_layer, n_ff, names) if hybrid else {}
    moe_fields = _moe_fields(ckpt, a, n_layer, n_ff, names) if _get(md, key("expert_count"), 0) else {}
    if a["moe_every_layer"] and not moe_fields:
        raise FrinkError(f"{ckpt.path}: model metadata is missing {arch}.expert_count")
    routed = moe_fields.get("moe_layers", ())
    if n_ff <= 0 and not (routed and all(routed)):
        raise FrinkError(f"{ckpt.path}: model metadata is missing {arch}.feed_forward_length (or it is 0)")

    return ModelConfig(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ff=n_ff,
        n_vocab=n_vocab,
        n_ctx_train=int(_get(md, key("context_length"), 4096)),
        norm_eps=float(_get(md, key("attention.layer_norm_rms_epsilon"), 1e-5)),
        rope_type=a["rope_type"],
        rope_dim=rope_dim,
        rope_base=float(_get(md, key("rope.freq_base"), 10000.0)),
        rope_scale=rope_scale,
        rope_base_swa=float(_get(md, key("rope.freq_base_swa"), a["rope_base_swa"] or _get(md, key("rope.freq_base"), 10000.0))),
        attn_scale=attn_scale,
        sliding_window=sliding_window,
        swa_layers=tuple(swa_layers),
        ffn_act=a["ffn_act"],
        qk_norm=bool(a["qk_norm"]),
        post_attn_norm=bool(a["post_attn_norm"]),
        post_ffn_norm=bool(a["post_ffn_norm"]),
        embd_scale=embd_scale,
        final_logit_softcap=positive_or_none(_get(md, key("final_logit_softcapping"))),
        attn_logit_softcap=positive_or_none(_get(md, key("attn_logit_softcapping"))),
        tied_embeddings="output.weight" not in names,
        has_rope_freqs="rope_freqs.weight" in names,
        ffn_norm_tensor=a["ffn_norm_tensor"],
        attn_output_gate=bool(a["attn_output_gate"]),
        **hybrid_fields,
        **moe_fields,
    )


def _check_imrope_sections(sections: Any, rope_dim: int, ckpt: Checkpoint) -> None:
    """qwen35's rope is llama.cpp's interleaved multi-section (IMROPE) rope. For text the
    temporal, height and width positions are all the token's position, so it is NeoX rope on
    rope_dim dims -- unless a rotated pair falls in the fourth section, which llama.cpp gives
    position 0 for text. No released model does; refuse such a file rather than guess."""
    if sections is None:
        raise FrinkError(f"{ckpt.path}: model metadata is missing {ckpt.arch}.rope.dimension_sections")
    sec = [int(x) for x in list(sections)][:4] + [0] * 4
    total = sum(sec[:4])
    if total <= 0:
        raise FrinkError(f"{ckpt.path}: bad rope.dimension_sections {list(sections)}")
    for i in range(rope_dim // 2):
        sector = i % total
        if not sector < 3 * sec[sector % 3]:
            raise FrinkError(
                f"{ckpt.path}: rope.dimension_sections {list(sections)} give rope pair {i} the "
                "fourth (extra) position, which frink does not support"
            )


def _hybrid_fields(ckpt: Checkpoint, a: dict[str, Any], n_layer: int, n_ff: int, names: set[str]) -> dict[str, Any]:
    """The gated delta net's shapes and which layers are recurrent, as llama.cpp reads them."""
    md, arch = ckpt.metadata, ckpt.arch

    def key(name: str) -> str:
        return f"{arch}.{name}"

    rec = _get(md, key("attention.recurrent_layers"))
    if rec is not None:
        recurrent = [bool(x) for x in list(rec)][:n_layer]
        if len(recurrent) != n_layer:
            raise FrinkError(f"{ckpt.path}: attention.recurrent_layers has {len(list(rec))} entries for {n_layer} layers")
    else:
        # llama.cpp's rule: every interval-th layer attends, the rest are recurrent.
        interval = int(_get(md, key("full_attention_interval"), 4))
        if interval <= 0:
            raise FrinkError(f"{ckpt.path}: bad full_attention_interval {interval}")
        recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]
    conv = int(_get(md, key("ssm.conv_kernel"), required=True))
    hk = int(_get(md, key("ssm.state_size"), required=True))
    n_k = int(_get(md, key("ssm.group_count"), required=True))
    n_v = int(_get(md, key("ssm.time_step_rank"), required=True))
    inner = int(_get(md, key("ssm.inner_size"), required=True))
    if min(conv, hk, n_k, n_v, inner) <= 0 or n_v % n_k or inner % n_v:
        raise FrinkError(
            f"{ckpt.path}: bad gated delta net sizes (conv {conv}, state {hk}, {n_k} key heads, "
            f"{n_v} value heads, inner {inner})"
        )
    return {
        "recurrent_layers": tuple(recurrent),
        "ssm_conv_kernel": conv,
        "ssm_n_k_heads": n_k,
        "ssm_n_v_heads": n_v,
        "ssm_head_dim_k": hk,
        "ssm_head_dim_v": inner // n_v,
        "ssm_v_head_order": a["gdn_v_head_order"],
    }


def _moe_fields(ckpt: Checkpoint, a: dict[str, Any], n_layer: int, n_ff: int, names: set[str]) -> dict[str, Any]:
    """Sparse MoE sizes; a layer is routed when it has a router (ffn_gate_inp)."""
    md, arch = ckpt.metadata, ckpt.arch

    def key(name: str) -> str:
        return f"{arch}.{name}"

    n_expert = int(_get(md, key("expert_count"), required=True))
    n_used = int(_get(md, key("expert_used_count"), required=True))
    if not 0 < n_used <= n_expert:
        raise FrinkError(f"{ckpt.path}: bad expert counts ({n_used} used of {n_expert})")
    # llama.cpp's fallbacks when the widths are not stated.
    n_ff_exp = int(_get(md, key("expert_feed_forward_length"), 0)) or n_ff // n_used
    has_shared = any(f"blk.{i}.ffn_up_shexp.weight" in names for i in range(n_layer))
    n_ff_shexp = (int(_get(md, key("expert_shared_feed_forward_length"), 0)) or n_ff) if has_shared else 0
    for what, value in (("expert_feed_forward_length", n_ff_exp), ("expert_shared_feed_forward_length", n_ff_shexp)):
        if value <= 0 and (what == "expert_feed_forward_length" or has_shared):
            raise FrinkError(f"{ckpt.path}: model metadata is missing {arch}.{what}")
    routed = tuple(f"blk.{i}.ffn_gate_inp.weight" in names for i in range(n_layer))
    if a["moe_every_layer"] and not all(routed):
        dense = routed.index(False)
        raise FrinkError(
            f"{ckpt.path}: layer {dense} has no router (blk.{dense}.ffn_gate_inp.weight): {arch} with "
            "dense FFN layers (HF mlp_only_layers / decoder_sparse_step) is not supported, as in llama.cpp"
        )
    return {
        "moe_layers": routed,
        "n_expert": n_expert,
        "n_expert_used": n_used,
        "n_ff_exp": n_ff_exp,
        "n_ff_shexp": n_ff_shexp,
        # llama.cpp's qwen3next always renormalizes; an HF config may say otherwise.
        "moe_norm_topk": bool(_get(md, key("expert_weights_norm"), True)),
    }
