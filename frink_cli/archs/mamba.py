"""Mamba-1 (`mamba`) and Mamba-2 (`mamba2`): stacks of selective state-space mixers, no
attention and no FFN.

Follows llama.cpp's src/models/mamba.cpp + graph-context-mamba.cpp (build_mamba_layer:
ggml_ssm_conv, ggml_ssm_scan) and transformers' MambaForCausalLM / FalconMambaForCausalLM.
Each layer is pre-norm (RMSNorm) -> mixer -> residual add; then the final norm and the lm
head (tied unless the file has output.weight). Falcon-Mamba is the same GGUF
architecture with `mamba.ssm.dt_b_c_rms` set: weightless RMSNorms on dt, B and C.

The HF side is the converter's MambaModel: A_log stored as A = -exp(A_log) (ssm_a), the
conv kernel [d_inner, 1, k] squeezed to [d_inner, k], head_count and feed_forward_length
written as 0, context_length 2**20, dt_rank ceil(hidden / 16) when the config says "auto".

Mamba-2 follows llama.cpp's src/models/mamba2.cpp (build_mamba2_layer) and transformers'
Mamba2ForCausalLM; the converter's Mamba2Model writes ssm.group_count (n_groups) and the
head count as ssm.time_step_rank (d_inner / head_dim), A = -exp(A_log) and D as [n_head, 1],
dt_bias as ssm_dt.bias and the gated norm's weight as [n_groups, d_inner / n_groups].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.mamba import MambaConfig, mamba, mamba2
from ..graph.blocks.step import At
from ..graph.ops import Array, Ops
from ..model.config import LayerShape, ModelConfig
from .base import Arch, get
from .decoder import DecoderConfig
from .hf import MetadataWriter, f32, hf_types
from .hf_plan import Transform
from .transforms import NEG_EXP, SQUEEZE, _reshape

# Mamba-2's per-head A and D as the converter stores them, [n_head] -> [n_head, 1]; its gated
# norm's weight [d_inner] -> [n_groups, d_inner / n_groups].
_UNSQUEEZE = Transform(_reshape, lambda s, hp: (*s, 1))


def _groups(hp: dict[str, Any]) -> int:
    return int(hp.get("n_groups") or hp.get("mamba_n_groups") or 1)


_PER_GROUP = Transform(_reshape, lambda s, hp: (_groups(hp), s[0] // _groups(hp)))


@dataclass(frozen=True)
class MambaStackConfig(DecoderConfig):
    """A stack whose mixers are Mamba-1 or Mamba-2 (all layers, or those mamba.layers
    names in a hybrid stack)."""

    # None: no layer is a mamba mixer (a hybrid file of attention layers only).
    mamba: MambaConfig | None = None

    def _m(self) -> MambaConfig:
        assert self.mamba is not None  # asked only of a mamba layer
        return self.mamba

    def layer_shape(self, cfg: ModelConfig, layer: int) -> LayerShape:
        shape = super().layer_shape(cfg, layer)
        m = self.mamba
        if m is None:
            return shape
        kind = "mamba2" if m.version2 else "mamba"
        if m.parallel:
            return replace(shape, mixer="attention+mamba2")
        if m.layers is None:
            shape = replace(shape, mixer=kind, n_head=0, n_head_kv=0, n_ff=0)
        elif m.layers[layer]:
            shape = replace(shape, mixer=kind, n_head=0, n_head_kv=0)
        if shape.n_ff == 0 and shape.ffn == "dense":
            shape = replace(shape, ffn="none")
        return shape

    def info(self) -> dict[str, Any]:
        m = self.mamba
        if m is None:
            return super().info()
        section = {
            "d_inner": m.d_inner,
            "d_state": m.d_state,
            "dt_rank": m.dt_rank,
            "conv_kernel": m.conv_kernel,
            "dt_b_c_rms": m.dt_b_c_rms,
            "n_group": m.n_group,
        }
        return {**super().info(), "mamba": section}

    def attends(self, cfg: ModelConfig) -> bool:
        return self.mamba is None  # a mamba layer has no heads to check

    def is_recurrent(self, cfg: ModelConfig, layer: int) -> bool:
        return self.mamba is not None and self.mamba.is_layer(layer)

    def recurrent_shapes(
        self, cfg: ModelConfig, layer: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self._m().state_shapes()

    def recurrent_state_bytes(self, cfg: ModelConfig) -> int:
        return 0 if self.mamba is None else self.mamba.state_bytes(cfg.n_layer)

    def mixer(
        self, ops: Ops, cfg: ModelConfig, shape: LayerShape, w: Any, h: Array, at: At
    ) -> Array:
        if shape.mixer == "mamba":
            return mamba(ops, self._m(), cfg.norm_eps, w.mamba, h, at.kv)
        if shape.mixer == "mamba2":
            return mamba2(ops, self._m(), cfg.norm_eps, w.mamba2, h, at.kv)
        return super().mixer(ops, cfg, shape, w, h, at)


def ssm_config(arch: Arch, ckpt: Checkpoint) -> MambaConfig:
    """The ssm.* keys llama.cpp's load_hparams reads, checked."""
    md, key = ckpt.metadata, arch.key
    m = MambaConfig(
        conv_kernel=int(get(md, key("ssm.conv_kernel"), required=True)),
        d_inner=int(get(md, key("ssm.inner_size"), required=True)),
        d_state=int(get(md, key("ssm.state_size"), required=True)),
        dt_rank=int(get(md, key("ssm.time_step_rank"), required=True)),
        dt_b_c_rms=bool(get(md, key("ssm.dt_b_c_rms"), False)),
    )
    if min(m.conv_kernel, m.d_inner, m.d_state, m.dt_rank) <= 0:
        raise FrinkError(
            f"{ckpt.path}: bad mamba sizes (conv {m.conv_kernel}, inner {m.d_inner}, "
            f"state {m.d_state}, dt rank {m.dt_rank})"
        )
    return m


class Mamba(Arch):
    name = "mamba"
    ext_class = MambaStackConfig
    hf_model_types = hf_types("mamba", "falcon_mamba")
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = (
        ("backbone.embeddings", "token_embd"),
        ("backbone.norm_f", "output_norm"),
        ("lm_head", "output"),
        ("backbone.layers.{bid}.norm", "blk.{bid}.attn_norm"),
        ("backbone.layers.{bid}.mixer.in_proj", "blk.{bid}.ssm_in"),
        ("backbone.layers.{bid}.mixer.conv1d", "blk.{bid}.ssm_conv1d"),
        ("backbone.layers.{bid}.mixer.x_proj", "blk.{bid}.ssm_x"),
        ("backbone.layers.{bid}.mixer.dt_proj", "blk.{bid}.ssm_dt"),
        ("backbone.layers.{bid}.mixer.out_proj", "blk.{bid}.ssm_out"),
    )
    hf_tensors_whole: ClassVar[tuple[tuple[str, str], ...]] = (
        ("backbone.layers.{bid}.mixer.A_log", "blk.{bid}.ssm_a"),
        ("backbone.layers.{bid}.mixer.D", "blk.{bid}.ssm_d"),
    )

    def ssm_config(self, ckpt: Checkpoint) -> MambaConfig:
        return ssm_config(self, ckpt)

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        """The mamba keys llama.cpp's load_hparams reads; the attention-shaped fields of
        ModelConfig are zero (no layer attends) and rope is unused."""
        md, key = ckpt.metadata, self.key
        names = set(ckpt.tensors.names())
        n_layer = int(get(md, key("block_count"), required=True))
        n_embd = int(get(md, key("embedding_length"), required=True))
        m = self.ssm_config(ckpt)
        if not 0 < n_layer <= len(names):
            raise FrinkError(
                f"{ckpt.path}: block_count {n_layer} does not fit the file's {len(names)} tensors"
            )
        if "token_embd.weight" not in names:
            raise FrinkError(f"{ckpt.path}: no token_embd.weight tensor")
        return ModelConfig(
            arch=self.name,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=0,
            n_head_kv=0,
            head_dim_k=0,
            head_dim_v=0,
            n_ff=0,
            n_vocab=ckpt.tensors.info("token_embd.weight").shape[0],
            n_ctx_train=int(get(md, key("context_length"), 1 << 20)),
            norm_eps=float(get(md, key("attention.layer_norm_rms_epsilon"), 1e-5)),
            rope_type="norm",
            rope_dim=0,
            rope_base=10000.0,
            rope_scale=1.0,
            rope_base_swa=10000.0,
            attn_scale=1.0,
            sliding_window=None,
            swa_layers=(False,) * n_layer,
            ffn_act="silu",
            tied_embeddings="output.weight" not in names,
            has_rope_freqs=False,
            ext=MambaStackConfig(mamba=m),
        )

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        return {"blk.{bid}.ssm_a": (NEG_EXP,), "blk.{bid}.ssm_conv1d.weight": (SQUEEZE,)}

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        # As the converter's MambaModel.set_gguf_parameters writes them.
        hp = w.hp
        d = int(hp["hidden_size"])
        inner = int(hp.get("intermediate_size") or int(hp.get("expand") or 2) * d)
        if inner != 2 * d:
            # The converter refuses these (it asserts d_inner == 2 * d_model).
            raise FrinkError(
                f"config.json: intermediate_size {inner} is not 2 x hidden_size {d}, which "
                "llama.cpp's converter refuses for mamba"
            )
        rank = hp.get("time_step_rank")
        if rank in (None, "auto"):
            rank = math.ceil(d / 16)
        w.set("context_length", 1 << 20)
        w.u32("embedding_length", "hidden_size")
        w.set("feed_forward_length", 0)
        w.set("attention.head_count", 0)
        w.u32("block_count", "num_hidden_layers")
        w.u32("ssm.conv_kernel", "conv_kernel")
        w.set("ssm.inner_size", inner)
        w.u32("ssm.state_size", "state_size")
        w.set("ssm.time_step_rank", int(rank))
        eps = hp.get("layer_norm_epsilon", hp.get("rms_norm_eps"))
        w.set("attention.layer_norm_rms_epsilon", f32(eps if eps is not None else 1e-5))
        falcon = hp.get("model_type") == "falcon_mamba"
        w.set("ssm.dt_b_c_rms", falcon)
        w.u32("vocab_size", "n_vocab")
        if falcon and hp.get("mixer_rms_eps") is not None and hp["mixer_rms_eps"] != eps:
            notes.append(
                f"mixer_rms_eps={hp['mixer_rms_eps']} is not applied: the dt/B/C norms use "
                f"layer_norm_epsilon={eps}, as llama.cpp does"
            )
        if hp.get("use_bias"):
            raise FrinkError(
                "config.json: use_bias (in_proj/out_proj biases) is not supported for mamba: "
                "llama.cpp's mamba graph has no such bias"
            )


def mamba2_ssm_config(arch: Arch, ckpt: Checkpoint, m: MambaConfig) -> MambaConfig:
    """Mamba-1's ssm keys plus ssm.group_count, checked as llama.cpp's graph asserts them
    (d_inner a multiple of the head count, heads a multiple of the groups)."""
    G = int(get(ckpt.metadata, arch.key("ssm.group_count"), required=True))
    H = m.dt_rank
    if G <= 0 or m.d_inner % H or H % G:
        raise FrinkError(
            f"{ckpt.path}: bad mamba2 sizes (inner {m.d_inner}, {H} heads, {G} groups: "
            "the heads must divide the inner size and the groups the heads)"
        )
    return MambaConfig(
        conv_kernel=m.conv_kernel,
        d_inner=m.d_inner,
        d_state=m.d_state,
        dt_rank=H,
        n_group=G,
        layers=m.layers,
    )


def mamba2_hf_metadata(
    w: MetadataWriter, conv: int, inner: int, state: int, n_heads: int, groups: int
) -> None:
    """The ssm.* keys the converter's Mamba2Model.set_gguf_parameters writes (and
    GraniteHybridModel's, from its mamba_* config keys)."""
    if n_heads <= 0 or inner % n_heads or groups <= 0 or n_heads % groups:
        raise FrinkError(
            f"config.json: bad mamba2 sizes (inner {inner}, {n_heads} heads, {groups} groups)"
        )
    w.set("ssm.conv_kernel", conv)
    w.set("ssm.inner_size", inner)
    w.set("ssm.state_size", state)
    w.set("ssm.time_step_rank", n_heads)
    w.set("ssm.group_count", groups)


MAMBA2_TRANSFORMS: dict[str, tuple[Transform, ...]] = {
    "blk.{bid}.ssm_a": (NEG_EXP, _UNSQUEEZE),
    "blk.{bid}.ssm_d": (_UNSQUEEZE,),
    "blk.{bid}.ssm_norm.weight": (_PER_GROUP,),
    "blk.{bid}.ssm_conv1d.weight": (SQUEEZE,),
}


def mamba2_mixer_tensors(
    prefix: str,
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """A Mamba-2 mixer's HF -> GGUF names under `prefix` (the mixer's module path with
    {bid}): (weight/bias modules, whole parameters), as the converter maps them for
    mamba2, granitehybrid and falcon-h1 alike."""
    modules = (
        (prefix + "in_proj", "blk.{bid}.ssm_in"),
        (prefix + "conv1d", "blk.{bid}.ssm_conv1d"),
        (prefix + "norm", "blk.{bid}.ssm_norm"),
        (prefix + "out_proj", "blk.{bid}.ssm_out"),
    )
    whole = (
        (prefix + "A_log", "blk.{bid}.ssm_a"),
        (prefix + "D", "blk.{bid}.ssm_d"),
        (prefix + "dt_bias", "blk.{bid}.ssm_dt.bias"),
    )
    return modules, whole


_MAMBA2_MODULES, _MAMBA2_WHOLE = mamba2_mixer_tensors("backbone.layers.{bid}.mixer.")


class Mamba2(Mamba):
    name = "mamba2"
    hf_model_types = hf_types("mamba2")
    hf_tensors: ClassVar[tuple[tuple[str, str], ...]] = (
        ("backbone.embeddings", "token_embd"),
        ("backbone.norm_f", "output_norm"),
        ("lm_head", "output"),
        ("backbone.layers.{bid}.norm", "blk.{bid}.attn_norm"),
        *_MAMBA2_MODULES,
    )
    hf_tensors_whole: ClassVar[tuple[tuple[str, str], ...]] = _MAMBA2_WHOLE

    def ssm_config(self, ckpt: Checkpoint) -> MambaConfig:
        return mamba2_ssm_config(self, ckpt, super().ssm_config(ckpt))

    def hf_transforms(self) -> dict[str, tuple[Transform, ...]]:
        return dict(MAMBA2_TRANSFORMS)

    def hf_metadata(self, w: MetadataWriter, notes: list[str]) -> None:
        # As the converter's Mamba2Model.set_gguf_parameters writes them.
        hp = w.hp
        d = int(hp["hidden_size"])
        inner = int(hp.get("intermediate_size") or int(hp.get("expand") or 2) * d)
        if inner != int(hp.get("expand") or 2) * d:
            raise FrinkError(
                f"config.json: intermediate_size {inner} is not expand x hidden_size, which "
                "llama.cpp's converter refuses for mamba2"
            )
        w.set("context_length", 1 << 20)
        w.u32("embedding_length", "hidden_size")
        w.set("feed_forward_length", 0)
        w.set("attention.head_count", 0)
        w.u32("block_count", "num_hidden_layers")
        head_dim = int(hp.get("head_dim") or 64)
        if inner % head_dim:
            raise FrinkError(f"config.json: inner size {inner} is not a multiple of head_dim")
        mamba2_hf_metadata(
            w,
            conv=int(hp.get("conv_kernel") or 4),
            inner=inner,
            state=int(hp.get("state_size") or 128),
            n_heads=inner // head_dim,
            groups=_groups(hp),
        )
        if hp.get("use_bias"):
            raise FrinkError(
                "config.json: use_bias (in_proj/out_proj biases) is not supported for mamba2: "
                "llama.cpp's mamba2 graph has no such bias"
            )
        eps = hp.get("layer_norm_epsilon", hp.get("rms_norm_eps"))
        w.set("attention.layer_norm_rms_epsilon", f32(eps if eps is not None else 1e-5))
        w.u32("vocab_size", "n_vocab")
