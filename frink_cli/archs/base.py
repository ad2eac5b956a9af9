"""What every architecture shares: reading llama-style GGUF metadata into a ModelConfig.

An architecture module subclasses `Arch` and states only what differs: its decorations
(class attributes), its special cases (method overrides: `attn_scale_default`,
`check_metadata`, `embd_scale`), and, through `HfConversion` (hf.py), its HF model_types,
tensor names, transforms and metadata. The GGUF keys read here are the ones llama.cpp's
llama_model_loader reads for every architecture (`{arch}.block_count`,
`{arch}.attention.head_count`, ...).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.gdn import GdnConfig
from ..graph.blocks.moe import MoeConfig
from ..model.config import LayerSizes, ModelConfig, RopeScaling
from .decoder import DecoderConfig
from .hf import HfConversion


def get(md: dict[str, Any], key: str, default: Any = None, *, required: bool = False) -> Any:
    if key in md:
        return md[key]
    if required:
        raise FrinkError(f"model metadata is missing {key}")
    return default


def _is_array(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or hasattr(value, "tolist")


def _per_layer_int(value: Any, key: str, skip_zero: bool = False) -> int:
    """GGUF allows per-layer arrays for head counts; frink's dense graph needs one value.

    skip_zero: hybrid models may write 0 for their recurrent layers, which have no heads.
    """
    if _is_array(value):
        vals = {int(v) for v in list(value) if not (skip_zero and int(v) == 0)}
        if len(vals) != 1:
            raise FrinkError(
                f"{key} varies per layer ({sorted(vals)}), which frink does not support"
            )
        return vals.pop()
    return int(value)


class Arch(HfConversion):
    """One architecture: its GGUF reading (here) and its HF conversion (HfConversion, hf.py).
    Subclass and override."""

    # --- identity -------------------------------------------------------------------
    name: ClassVar[str]  # GGUF general.architecture

    # --- decorations and defaults (ModelConfig fields) --------------------------------
    rope_type: ClassVar[str] = "norm"  # "norm" (adjacent pairs) | "neox" (halves)
    ffn_act: ClassVar[str] = "silu"
    qk_norm: ClassVar[bool] = False
    post_attn_norm: ClassVar[bool] = False
    post_ffn_norm: ClassVar[bool] = False
    attn_output_gate: ClassVar[bool] = False
    # GGUF sliding_window_pattern when the file leaves it out (llama.cpp hard-codes it).
    swa_pattern: ClassVar[int | None] = None
    # rope base of the sliding-window layers when the file leaves it out.
    rope_base_swa: ClassVar[float | None] = None
    # Gated delta net layers: None (none), else the value-head order ("tiled" | "grouped").
    gdn_v_head_order: ClassVar[str | None] = None
    # llama.cpp requires a router on every layer (expert_count must be present).
    moe_every_layer: ClassVar[bool] = False
    # Layers whose head_count_kv entry is 0 are recurrent, not attention (lfm2's short
    # convs, granitehybrid's mamba2 layers): the per-layer KV head counts then skip those
    # zeros, as a GDN hybrid's do; the attention layers' count is the model's.
    zero_kv_recurrent: ClassVar[bool] = False
    # Head counts and FFN widths may differ per layer (ModelConfig.layer_sizes: openelm,
    # deci); zero_head_layers: a layer may have no attention (0 heads) or wo alone (0 KV
    # heads); zero_ffn_layers: a layer may have no FFN (deci).
    per_layer_sizes: ClassVar[bool] = False
    zero_head_layers: ClassVar[bool] = False
    zero_ffn_layers: ClassVar[bool] = False

    # The architecture's own config (archs/decoder.py's DecoderConfig or a subclass in the
    # architecture's module): its fields and its layer.
    ext_class: ClassVar[type[DecoderConfig]] = DecoderConfig

    # --- weight loading: where each layer's norms are stored ---------------------------
    # The pre-FFN norm's GGUF name (qwen35/qwen3next store it as post_attention_norm).
    ffn_norm_tensor: ClassVar[str] = "ffn_norm"

    # =================================================================================
    # GGUF metadata -> ModelConfig

    def key(self, name: str) -> str:
        return f"{self.name}.{name}"

    def attn_scale_default(self, n_layer: int, n_embd: int, n_head: int, head_dim_k: int) -> float:
        """The query scale when the file states no attention.scale."""
        return 1.0 / math.sqrt(head_dim_k)

    def embd_scale(self, n_embd: int) -> float | None:
        """The factor the token embeddings are multiplied by (None: not scaled)."""
        return None

    def check_metadata(self, ckpt: Checkpoint, rope_dim: int) -> None:
        """Refuse metadata this architecture's graph cannot honour (hook; default none)."""

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        """ModelConfig from the checkpoint's canonical metadata and tensor names."""
        md, key = ckpt.metadata, self.key
        # block_count includes any multi-token-prediction (NextN) blocks stored after the
        # trunk; like llama.cpp's main pass, frink runs the trunk only.
        n_layer = int(get(md, key("block_count"), required=True)) - int(
            get(md, key("nextn_predict_layers"), 0)
        )
        n_embd = int(get(md, key("embedding_length"), required=True))
        names = set(ckpt.tensors.names())
        n_head, n_head_kv, n_ff, head_dim_default, layer_sizes = self._heads(
            ckpt, n_layer, n_embd, names
        )
        head_dim_k = int(get(md, key("attention.key_length"), head_dim_default))
        head_dim_v = int(get(md, key("attention.value_length"), head_dim_k))
        self._check_sizes(ckpt, n_layer, names, n_embd, head_dim_k, head_dim_v, n_ff)
        rope_scale, rope_scaling = self._rope_scaling(ckpt, names)
        sliding_window = get(md, key("attention.sliding_window"))
        sliding_window = int(sliding_window) if sliding_window else None
        swa_layers = self._swa_layers(md, n_layer) if sliding_window else [False] * n_layer
        attn_scale = float(
            get(
                md,
                key("attention.scale"),
                self.attn_scale_default(n_layer, n_embd, n_head, head_dim_k),
            )
        )
        if self.attn_output_gate and head_dim_k != head_dim_v:
            # The gate has one value per query dim and multiplies the attention output per dim.
            raise FrinkError(
                f"{ckpt.path}: gated attention needs key_length == value_length "
                f"({head_dim_k} != {head_dim_v})"
            )
        rope_dim = int(get(md, key("rope.dimension_count"), head_dim_k))
        self.check_metadata(ckpt, rope_dim)
        ext = self._ext_config(ckpt, n_layer, n_embd, n_ff, names)
        rope_base = float(get(md, key("rope.freq_base"), 10000.0))
        return ModelConfig(
            arch=self.name,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=head_dim_k,
            head_dim_v=head_dim_v,
            n_ff=n_ff,
            n_vocab=ckpt.tensors.info("token_embd.weight").shape[0],
            n_ctx_train=int(get(md, key("context_length"), 4096)),
            norm_eps=float(get(md, key("attention.layer_norm_rms_epsilon"), 1e-5)),
            rope_type=self.rope_type,
            rope_dim=rope_dim,
            rope_base=rope_base,
            rope_scale=rope_scale,
            rope_base_swa=float(
                get(md, key("rope.freq_base_swa"), self.rope_base_swa or rope_base)
            ),
            attn_scale=attn_scale,
            sliding_window=sliding_window,
            swa_layers=tuple(swa_layers),
            ffn_act=self.ffn_act,
            tied_embeddings="output.weight" not in names,
            has_rope_freqs="rope_freqs.weight" in names,
            rope_scaling=rope_scaling,
            layer_sizes=layer_sizes,
            ext=ext,
        )

    def _heads(
        self, ckpt: Checkpoint, n_layer: int, n_embd: int, names: set[str]
    ) -> tuple[int, int, int, int, LayerSizes | None]:
        """(n_head, n_head_kv, n_ff, the default head width, per-layer sizes or None): the
        largest of each where they vary per layer."""
        md, key = ckpt.metadata, self.key
        if self.per_layer_sizes:
            sizes = self._layer_sizes(ckpt, n_layer, len(names))
            n_head, n_head_kv, n_ff = (max(v) for v in dataclasses.astuple(sizes))
            # llama.cpp sizes heads from layer 0 (hparams.n_head() is n_head(0)).
            head_dim = n_embd // sizes.n_head[0] if sizes.n_head[0] else 0
            if all(len(set(v)) == 1 for v in dataclasses.astuple(sizes)):
                return n_head, n_head_kv, n_ff, head_dim, None  # every layer alike
            return n_head, n_head_kv, n_ff, head_dim, sizes
        hybrid = self.gdn_v_head_order is not None or self.zero_kv_recurrent
        n_head = _per_layer_int(
            get(md, key("attention.head_count"), required=True), "head_count", hybrid
        )
        n_head_kv = _per_layer_int(
            get(md, key("attention.head_count_kv"), n_head), "head_count_kv", hybrid
        )
        if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
            raise FrinkError(f"bad head counts: {n_head} query heads, {n_head_kv} KV heads")
        # A model whose every FFN is routed may have no dense FFN width at all; 0 here, and
        # required (_ext_config) only if some layer is dense.
        n_ff = _per_layer_int(get(md, key("feed_forward_length"), 0), "feed_forward_length")
        return n_head, n_head_kv, n_ff, n_embd // n_head, None

    def _check_sizes(
        self,
        ckpt: Checkpoint,
        n_layer: int,
        names: set[str],
        n_embd: int,
        head_dim_k: int,
        head_dim_v: int,
        n_ff: int,
    ) -> None:
        """Refuse sizes no model has, before anything is sized from them."""
        # Every layer holds at least one tensor, so a block count above the tensor count is
        # a corrupt header; checking here keeps per-layer lists (swa_layers, info) from
        # allocating billions of entries.
        if not 0 < n_layer <= len(names):
            raise FrinkError(
                f"{ckpt.path}: block_count {n_layer} does not fit the file's {len(names)} tensors"
            )
        # feed_forward_length may be 0 (or absent) where every FFN is routed: checked later.
        sizes = {
            "embedding_length": n_embd,
            "attention.key_length": head_dim_k,
            "attention.value_length": head_dim_v,
            "feed_forward_length": n_ff or 1,
        }
        for what, value in sizes.items():
            if value <= 0:
                raise FrinkError(f"{ckpt.path}: bad model metadata ({self.name}.{what} = {value})")
        if "token_embd.weight" not in names:
            raise FrinkError(f"{ckpt.path}: no token_embd.weight tensor")

    def _ext_config(
        self, ckpt: Checkpoint, n_layer: int, n_embd: int, n_ff: int, names: set[str]
    ) -> DecoderConfig:
        """The architecture's own config (ext_class): the decorations its class states,
        the softcaps its file states, its GDN and MoE block configs."""
        md, key = ckpt.metadata, self.key
        gdn = self._gdn_config(ckpt, n_layer) if self.gdn_v_head_order is not None else None
        has_moe = bool(get(md, key("expert_count"), 0))
        moe = self._moe_config(ckpt, n_layer, n_ff, names) if has_moe else None
        if self.moe_every_layer and moe is None:
            raise FrinkError(f"{ckpt.path}: model metadata is missing {self.name}.expert_count")
        routed = moe.layers if moe is not None else ()
        if n_ff <= 0 and not (routed and all(routed)):
            raise FrinkError(
                f"{ckpt.path}: model metadata is missing {self.name}.feed_forward_length "
                "(or it is 0)"
            )

        def positive_or_none(v: Any) -> float | None:
            return float(v) if v else None

        # A GDN hybrid's own block config, for its architecture config class.
        extra: dict[str, Any] = {} if gdn is None else {"gdn": gdn}
        return self.ext_class(
            qk_norm=self.qk_norm,
            post_attn_norm=self.post_attn_norm,
            post_ffn_norm=self.post_ffn_norm,
            embd_scale=self.embd_scale(n_embd),
            final_logit_softcap=positive_or_none(get(md, key("final_logit_softcapping"))),
            attn_logit_softcap=positive_or_none(get(md, key("attn_logit_softcapping"))),
            ffn_norm_tensor=self.ffn_norm_tensor,
            attn_output_gate=self.attn_output_gate,
            moe=moe,
            **extra,
        )

    def _layer_sizes(self, ckpt: Checkpoint, n_layer: int, n_tensors: int) -> LayerSizes:
        """Per-layer head counts, KV head counts and FFN widths, as llama.cpp's
        get_key_or_arr reads them: an array of n_layer entries, or one value for every layer
        (head_count_kv defaults to head_count). Zeros (deci's layers without attention or
        FFN) only where the architecture has such layers."""
        md, key = ckpt.metadata, self.key
        if not 0 < n_layer <= n_tensors:  # before any per-layer list is built from it
            raise FrinkError(
                f"{ckpt.path}: block_count {n_layer} does not fit the file's {n_tensors} tensors"
            )

        # An array may also cover the NextN blocks stored after the trunk (block_count).
        n_blocks = int(get(md, key("block_count"), n_layer))

        def per_layer(name: str, value: Any) -> tuple[int, ...]:
            if _is_array(value):
                vals = tuple(int(v) for v in list(value))
                if len(vals) == n_blocks:
                    vals = vals[:n_layer]
                if len(vals) != n_layer:
                    raise FrinkError(
                        f"{ckpt.path}: {self.key(name)} has {len(vals)} entries for "
                        f"{n_layer} layers"
                    )
                return vals
            return (int(value),) * n_layer

        heads_raw = get(md, key("attention.head_count"), required=True)
        heads = per_layer("attention.head_count", heads_raw)
        kv = per_layer(
            "attention.head_count_kv", get(md, key("attention.head_count_kv"), heads_raw)
        )
        ff = per_layer("feed_forward_length", get(md, key("feed_forward_length"), required=True))
        for i, (h, k, f) in enumerate(zip(heads, kv, ff)):
            zero_heads = h == 0 or k == 0
            if min(h, k, f) < 0 or (k > 0 and (h == 0 or h % k)):
                raise FrinkError(
                    f"{ckpt.path}: bad head counts in layer {i}: {h} query heads, {k} KV heads"
                )
            if zero_heads and not self.zero_head_layers:
                raise FrinkError(
                    f"{ckpt.path}: layer {i} has {h} query / {k} KV heads: {self.name} layers "
                    "all attend"
                )
            if f == 0 and not self.zero_ffn_layers:
                raise FrinkError(f"{ckpt.path}: layer {i} has feed_forward_length 0")
        if heads[0] == 0:
            # llama.cpp reads the head size from layer 0 and breaks without it.
            raise FrinkError(f"{ckpt.path}: layer 0 has no attention heads (llama.cpp needs them)")
        return LayerSizes(n_head=heads, n_head_kv=kv, n_ff=ff)

    def _rope_scaling(self, ckpt: Checkpoint, names: set[str]) -> tuple[float, RopeScaling | None]:
        """The position multiplier (1/factor) and YaRN / LongRoPE, as llama.cpp reads them
        (llama_model::load_hparams and llama_context's cparams).

        A missing rope.scaling.type is "linear" there (a factor alone scales positions);
        "none" never scales. YaRN: ext_factor 1, beta_fast 32, beta_slow 1 -- llama.cpp reads
        no yarn_beta_fast / yarn_beta_slow / yarn_ext_factor / yarn_attn_factor key for these
        architectures, so neither does frink (transformers applies a config's beta_fast,
        beta_slow and attention_factor: a converted file that sets them runs as llama.cpp
        runs it). LongRoPE: the file's rope_factors_long/short tensors (phi3 writes no
        scaling type). rope.scaling.attn_factor multiplies cos and sin in every case."""
        md, key = ckpt.metadata, self.key
        scaling_type = str(get(md, key("rope.scaling.type"), "linear"))
        factor = float(get(md, key("rope.scaling.factor"), 0.0) or 0.0)
        if scaling_type not in ("none", "linear", "yarn", "longrope"):
            raise FrinkError(f"rope scaling type {scaling_type!r} is not supported")
        rope_scale = 1.0 / factor if factor > 0 and scaling_type != "none" else 1.0
        attn_factor = float(get(md, key("rope.scaling.attn_factor"), 1.0))
        n_ctx_train = int(get(md, key("context_length"), 4096))
        orig_ctx = int(get(md, key("rope.scaling.original_context_length"), 0)) or n_ctx_train
        long_factors = "rope_factors_long.weight" in names
        if scaling_type == "yarn":
            kind, ext = "yarn", 1.0
        elif long_factors:
            kind, ext = "longrope", 0.0
        elif scaling_type == "longrope":
            raise FrinkError(f"{ckpt.path}: longrope scaling without rope_factors_long.weight")
        elif attn_factor != 1.0:
            kind, ext = "attn", 0.0
        else:
            return rope_scale, None
        if not (attn_factor > 0 and math.isfinite(attn_factor)) or orig_ctx <= 0:
            raise FrinkError(
                f"{ckpt.path}: bad rope scaling (attn_factor {attn_factor}, "
                f"original context {orig_ctx})"
            )
        return rope_scale, RopeScaling(
            kind=kind,
            factor=1.0 / rope_scale,
            orig_ctx=orig_ctx,
            ext_factor=ext,
            attn_factor=attn_factor,
        )

    def _swa_layers(self, md: dict[str, Any], n_layer: int) -> list[bool]:
        """Per layer: does it use the sliding window? An explicit per-layer array, else
        llama.cpp's rule: in each group of n layers, all but the last use the window."""
        pattern = get(md, self.key("attention.sliding_window_pattern"), self.swa_pattern)
        if _is_array(pattern):
            swa_layers = [bool(x) for x in list(pattern)][:n_layer]
            if len(swa_layers) != n_layer:
                raise FrinkError(
                    f"sliding_window_pattern has {len(pattern)} entries for {n_layer} layers"
                )
            return swa_layers
        n = int(pattern or 0)
        return [n == 0 or (i % n < n - 1) for i in range(n_layer)]

    def _gdn_config(self, ckpt: Checkpoint, n_layer: int) -> GdnConfig:
        """The gated delta net's shapes and which layers are recurrent, as llama.cpp reads
        them."""
        md, key = ckpt.metadata, self.key
        rec = get(md, key("attention.recurrent_layers"))
        if rec is not None:
            recurrent = [bool(x) for x in list(rec)][:n_layer]
            if len(recurrent) != n_layer:
                raise FrinkError(
                    f"{ckpt.path}: attention.recurrent_layers has {len(list(rec))} entries "
                    f"for {n_layer} layers"
                )
        else:
            # llama.cpp's rule: every interval-th layer attends, the rest are recurrent.
            interval = int(get(md, key("full_attention_interval"), 4))
            if interval <= 0:
                raise FrinkError(f"{ckpt.path}: bad full_attention_interval {interval}")
            recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]
        conv = int(get(md, key("ssm.conv_kernel"), required=True))
        hk = int(get(md, key("ssm.state_size"), required=True))
        n_k = int(get(md, key("ssm.group_count"), required=True))
        n_v = int(get(md, key("ssm.time_step_rank"), required=True))
        inner = int(get(md, key("ssm.inner_size"), required=True))
        if min(conv, hk, n_k, n_v, inner) <= 0 or n_v % n_k or inner % n_v:
            raise FrinkError(
                f"{ckpt.path}: bad gated delta net sizes (conv {conv}, state {hk}, {n_k} key "
                f"heads, {n_v} value heads, inner {inner})"
            )
        assert self.gdn_v_head_order is not None
        return GdnConfig(
            layers=tuple(recurrent),
            conv_kernel=conv,
            n_k_heads=n_k,
            n_v_heads=n_v,
            head_dim_k=hk,
            head_dim_v=inner // n_v,
            v_head_order=self.gdn_v_head_order,
        )

    def _moe_config(self, ckpt: Checkpoint, n_layer: int, n_ff: int, names: set[str]) -> MoeConfig:
        """Sparse MoE sizes; a layer is routed when it has a router (ffn_gate_inp)."""
        md, arch, key = ckpt.metadata, self.name, self.key
        n_expert = int(get(md, key("expert_count"), required=True))
        n_used = int(get(md, key("expert_used_count"), required=True))
        if not 0 < n_used <= n_expert:
            raise FrinkError(f"{ckpt.path}: bad expert counts ({n_used} used of {n_expert})")
        # llama.cpp's fallbacks when the widths are not stated.
        n_ff_exp = int(get(md, key("expert_feed_forward_length"), 0)) or n_ff // n_used
        has_shared = any(f"blk.{i}.ffn_up_shexp.weight" in names for i in range(n_layer))
        n_ff_shexp = (
            (int(get(md, key("expert_shared_feed_forward_length"), 0)) or n_ff) if has_shared else 0
        )
        for what, value in (
            ("expert_feed_forward_length", n_ff_exp),
            ("expert_shared_feed_forward_length", n_ff_shexp),
        ):
            if value <= 0 and (what == "expert_feed_forward_length" or has_shared):
                raise FrinkError(f"{ckpt.path}: model metadata is missing {arch}.{what}")
        routed = tuple(f"blk.{i}.ffn_gate_inp.weight" in names for i in range(n_layer))
        if self.moe_every_layer and not all(routed):
            dense = routed.index(False)
            raise FrinkError(
                f"{ckpt.path}: layer {dense} has no router (blk.{dense}.ffn_gate_inp.weight): "
                f"{arch} with dense FFN layers (HF mlp_only_layers / decoder_sparse_step) is "
                "not supported, as in llama.cpp"
            )
        return MoeConfig(
            layers=routed,
            n_expert=n_expert,
            n_expert_used=n_used,
            n_ff_exp=n_ff_exp,
            n_ff_shexp=n_ff_shexp,
            # llama.cpp's qwen3next always renormalizes; an HF config may say otherwise.
            norm_topk=bool(get(md, key("expert_weights_norm"), True)),
        )
