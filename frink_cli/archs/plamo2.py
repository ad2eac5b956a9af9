"""PLaMo-2 (`plamo2`): Mamba layers and attention layers in one stack, each branch between
a pre-norm and a post-norm, every layer with a fused SwiGLU FFN between its own pre- and
post-norm.

Follows llama.cpp's src/models/plamo2.cpp (transformers has no PLaMo-2 class: the model
is remote code, so llama.cpp is the reference). A layer is Mamba where the GGUF's
per-layer attention.head_count_kv is 0 (llama.cpp's is_recr), else attention:

    attention: qkv = W_qkv h (fused); Q and K RMS-normed per head, each head with its own
               weights (attn_q_norm [n_head, hd], attn_k_norm [n_head_kv, hd]); NeoX rope
               over the whole head; q.k scaled by 1/sqrt(value head width)
    mamba:     Mamba-1's selective scan with one dt, A and D per head (ssm.time_step_rank
               heads of inner_size / heads channels) and one B/C group (group_count 0):
               in_proj's rows are [z_h, x_h] per head; conv without bias; x_proj yields B,
               C, then dt (max(64, n_embd / 16) wide), each RMS-normed with its weights;
               dt = softplus(dt_proj dt + dt_bias); y = C.h + D x; out(y * silu(z))
    layer:     x += post_mixer_norm(mixer(pre_mixer_norm(x)))
               x += post_mlp_norm(down(swiglu(up(pre_mlp_norm(x)))))  (ffn_up: gate, up)

The Mamba mixer is graph/blocks/mamba.py's Mamba-1 block: read_mamba_heads
lays the file's per-head tensors out as its per-channel ones (MambaConfig.heads). The
norms llama.cpp's converter renames without a ".weight" suffix (post_attention_norm,
post_ffw_norm, ssm_dt_norm, ssm_b_norm, ssm_c_norm) are read under those names.

Only GGUF is read: an HF directory of PLaMo-2 needs its remote code, and with no
reference to check a conversion against, frink carries none.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.mamba import MambaConfig
from ..model.block_weights import MambaWeights
from ..model.config import LayerPlan, LayerShape, ModelConfig
from ..model.linear import Linear, dequantized
from ..model.reader import TensorReader, placeholder
from .base import Arch, get
from .decoder import with_ext
from .mamba import MambaStackConfig, ssm_config
from .mamba_hybrid import zero_kv_layers


@dataclass(frozen=True)
class Plamo2Config(MambaStackConfig):
    """Mamba layers (per-head dt, A and D) between attention layers whose Q/K norms carry
    one weight row per head."""

    # attn_q_norm / attn_k_norm hold each head's own weights ([n_head, hd]).
    qk_norm_heads: bool = False

    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        # The post-norms are read in read_layer (stored without a .weight suffix).
        plan = super().layer_plan(cfg, shape)
        qk = "heads" if self.qk_norm_heads else plan.qk_norm
        return dataclasses.replace(plan, post_attn_norm=False, post_ffn_norm=False, qk_norm=qk)

    def read_layer(self, r: TensorReader, cfg: ModelConfig, layer: int, base: Any) -> Any:
        p, d = f"blk.{layer}.", cfg.n_embd
        changes = {}
        if self.post_attn_norm and base.post_attn_norm is None:
            changes["post_attn_norm"] = r.get(p + "post_attention_norm", (d,))
        if self.post_ffn_norm and base.post_ffn_norm is None:
            changes["post_ffn_norm"] = r.get(p + "post_ffw_norm", (d,))
        return dataclasses.replace(base, **changes)

    def read_mixer(self, r: TensorReader, cfg: ModelConfig, shape: LayerShape, p: str) -> Any:
        return read_mamba_heads(r, p, cfg.n_embd, self.block("mamba"))

    def info(self) -> dict[str, Any]:
        out = super().info()
        if self.mamba is not None:
            out["mamba"] = {**out["mamba"], "heads": self.mamba.heads}
        return out


def read_mamba_heads(r: TensorReader, p: str, d: int, m: MambaConfig) -> MambaWeights:
    """Layer p's mixer (llama.cpp's plamo2 tensors) laid out as Mamba-1's, exactly:
    ssm_in's rows [z_h, x_h] per head regrouped as all x rows then all z rows; ssm_x's
    rows B, C, dt reordered dt, B, C; dt_proj [heads, dt_rank] (+ bias), A and D [heads]
    repeated over each head's channels; no conv bias; the dt/B/C norm weights (stored
    without a .weight suffix)."""
    di, ds, rank, H = m.d_inner, m.d_state, m.dt_rank, m.heads
    hd = di // H
    per_head = np.arange(2 * di).reshape(H, 2, hd)  # [head, (z, x), channel] -> row
    in_rows = np.concatenate([per_head[:, 1].ravel(), per_head[:, 0].ravel()])
    x_rows = np.concatenate([np.arange(2 * ds, 2 * ds + rank), np.arange(2 * ds)])

    def rows(name: str, order: np.ndarray, n_in: int) -> Linear:
        w = r.linear([(p + name, len(order))], n_in, bias=False)
        return Linear(placeholder((len(order), n_in)) if r.meta else w.dense()[order], None)

    dt = r.linear([(p + "ssm_dt", H)], rank, bias=False).w
    dt_w = placeholder((di, rank)) if r.meta else np.repeat(dequantized(dt), hd, axis=0)
    return MambaWeights(
        in_proj=rows("ssm_in", in_rows, d),
        conv=r.get(p + "ssm_conv1d.weight", (di, m.conv_kernel)),
        conv_b=None,
        x_proj=rows("ssm_x", x_rows, di),
        dt_proj=Linear(dt_w, np.repeat(r.get(p + "ssm_dt.bias", (H,)), hd)),
        a=np.repeat(r.get(p + "ssm_a", (H,)), hd)[:, None],
        d=np.repeat(r.get(p + "ssm_d", (H,)), hd),
        out=r.linear([(p + "ssm_out", d)], di, bias=False),
        dt_norm=r.get(p + "ssm_dt_norm", (rank,)),
        b_norm=r.get(p + "ssm_b_norm", (ds,)),
        c_norm=r.get(p + "ssm_c_norm", (ds,)),
    )


def dt_width(n_embd: int) -> int:
    """x_proj's dt width, as llama.cpp computes it (the file does not say it)."""
    return max(64, n_embd // 16)


class Plamo2(Arch):
    name = "plamo2"
    rope_type = "neox"
    post_attn_norm = True
    post_ffn_norm = True
    zero_kv_recurrent = True
    ext_class = Plamo2Config

    def config(self, ckpt: Checkpoint) -> ModelConfig:
        """The keys llama.cpp's plamo2 load_arch_hparams reads, checked against the file's
        tensors before anything is sized from them."""
        cfg = super().config(ckpt)
        recurrent = zero_kv_layers(self, ckpt, cfg)
        mamba = None
        if any(recurrent):
            mamba = self._mamba(ckpt, cfg.n_embd, recurrent)
        # llama.cpp scales q.k by the value head width and reads no attention.scale.
        cfg = dataclasses.replace(cfg, attn_scale=1.0 / math.sqrt(cfg.head_dim_v))
        return with_ext(cfg, mamba=mamba, qk_norm_heads=True)

    def _mamba(self, ckpt: Checkpoint, n_embd: int, recurrent: tuple[bool, ...]) -> MambaConfig:
        """The Mamba mixer's ssm.* keys: group_count 0 (llama.cpp asserts it), the heads
        dividing the inner size, and every size the first Mamba layer's tensors have."""
        m = ssm_config(self, ckpt)
        key = self.key("ssm.group_count")
        groups = int(get(ckpt.metadata, key, required=True))
        if groups != 0:
            raise FrinkError(f"{ckpt.path}: {key} is {groups}: plamo2's Mamba layers have none")
        heads = m.dt_rank
        if m.d_inner % heads:
            raise FrinkError(
                f"{ckpt.path}: {self.key('ssm.time_step_rank')} {heads} (the Mamba heads) does "
                f"not divide {self.key('ssm.inner_size')} {m.d_inner}"
            )
        rank = dt_width(n_embd)
        p, names = f"blk.{recurrent.index(True)}.", set(ckpt.tensors.names())
        expected = {
            "ssm_in.weight": ((2 * m.d_inner, n_embd), "ssm.inner_size"),
            "ssm_conv1d.weight": ((m.d_inner, m.conv_kernel), "ssm.conv_kernel"),
            "ssm_x.weight": ((rank + 2 * m.d_state, m.d_inner), "ssm.state_size"),
            "ssm_a": ((heads,), "ssm.time_step_rank"),
        }
        for name, (shape, what) in expected.items():
            info = ckpt.tensors.info(p + name) if p + name in names else None
            if info is None or tuple(info.shape) != shape:
                found = "missing" if info is None else f"shaped {tuple(info.shape)}"
                raise FrinkError(
                    f"{ckpt.path}: {p}{name} is {found}, not {shape} as {self.key(what)} and "
                    "the other ssm sizes say"
                )
        return dataclasses.replace(m, dt_rank=rank, dt_b_c_rms=True, heads=heads, layers=recurrent)
