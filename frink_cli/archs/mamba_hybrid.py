"""What the hybrid Mamba-2 architectures (falcon-h1, granitehybrid) share: the mixer's HF
tensors under model.layers.N.mamba., transformers' mamba_* config defaults, the ssm.* GGUF
metadata the converter writes from those keys, and the mixer's config read back from GGUF.

Both converters (FalconH1Model, GraniteHybridModel) go through Mamba2Model for the mixer,
so its names, transforms (mamba.MAMBA2_TRANSFORMS) and keys are the same in both.
"""

from __future__ import annotations

from ..errors import FrinkError
from ..formats import Checkpoint
from ..graph.blocks.mamba import MambaConfig
from ..model.config import ModelConfig
from .base import Arch, _is_array, get
from .hf import MetadataWriter
from .mamba import _groups, mamba2_hf_metadata, mamba2_mixer_tensors, mamba2_ssm_config, ssm_config

MIXER_MODULES, MIXER_WHOLE = mamba2_mixer_tensors("model.layers.{bid}.mamba.")


def mamba2_config(arch: Arch, ckpt: Checkpoint) -> MambaConfig:
    """The Mamba-2 mixer's ssm.* keys, checked (llama.cpp's load_hparams)."""
    return mamba2_ssm_config(arch, ckpt, ssm_config(arch, ckpt))


def zero_kv_layers(arch: Arch, ckpt: Checkpoint, cfg: ModelConfig) -> tuple[bool, ...]:
    """Per layer: its attention.head_count_kv entry is 0 (llama.cpp's is_recr: a Mamba
    layer in a hybrid stack); one value stands for every layer."""
    key = arch.key("attention.head_count_kv")
    kv = get(ckpt.metadata, key, cfg.n_head)
    kv = list(kv) if _is_array(kv) else [kv] * cfg.n_layer
    if len(kv) != cfg.n_layer:
        raise FrinkError(f"{ckpt.path}: {key} has {len(kv)} entries for {cfg.n_layer} layers")
    return tuple(int(v) == 0 for v in kv)


def mamba2_metadata(w: MetadataWriter, inner: int, n_heads: int) -> None:
    """The ssm.* keys from the mamba_* config keys (`inner` channels in `n_heads` heads);
    the mixer's in_proj/out_proj biases (mamba_proj_bias) are refused, as llama.cpp's
    mamba2 graph has none."""
    hp = w.hp
    if hp.get("mamba_proj_bias"):
        raise FrinkError(
            "config.json: mamba_proj_bias (in_proj/out_proj biases) is not supported: "
            "llama.cpp's mamba2 graph has no such bias"
        )
    mamba2_hf_metadata(
        w,
        conv=int(hp.get("mamba_d_conv") or 4),
        inner=inner,
        state=int(hp.get("mamba_d_state") or 256),
        n_heads=n_heads,
        groups=_groups(hp),
    )
