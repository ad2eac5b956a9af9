"""HostBody: the whole decoder stack in NumPy, layer by layer.

A layer is a pre-norm mixer and a pre-norm FFN, each optionally followed by its own
post-norm (gemma3), each added back to the residual stream. The mixer is attention or a
gated delta net, the FFN dense or a sparse MoE, as cfg.layer_shape(l) says. `layer()` serves every kind of
step; the decoder loop decides which layers run here and which on a backend.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np

from ..model.config import ModelConfig
from ..model.weights import ModelWeights
from .attention import attention
from .ffn import dense_ffn
from .gdn import gdn
from .linear import linear
from .moe import moe_ffn
from .norms import rms_norm
from .rope import Rope

_malloc_tuned = False


def keep_freed_memory() -> None:
    """Have glibc keep freed blocks up to 32 MiB for reuse instead of returning them.

    A prefill's temporaries (scores, gate/up rows: megabytes each) are allocated and freed
    every layer. glibc hands blocks that size back to the kernel on free (mmap, or a heap
    trim), so the next layer's first touch of every page faults again: ~10,000 page faults
    and ~8% of a SmolLM2 pp512 here, ~40% of the attention core's time. Kept, the pages
    are reused warm. Larger blocks (a 262k-row embedding being dequantized at load) are
    still returned. Process-wide and glibc only; elsewhere a no-op.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h> parameter numbers
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 256 << 20)


class HostBody:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights) -> None:
        self.cfg = cfg
        self.w = weights
        keep_freed_memory()
        ropes: dict[tuple[float, float], Rope] = {}
        self.ropes = []
        # Fixed per model; asked once here, not once per layer per token.
        self.shapes = [cfg.layer_shape(layer) for layer in range(cfg.n_layer)]
        for layer in range(cfg.n_layer):
            s = self.shapes[layer]
            key = (s.rope_base, s.rope_scale)
            if key not in ropes:
                ropes[key] = Rope(cfg.rope_dim, s.rope_base, s.rope_scale, cfg.rope_type, weights.rope_freqs)
            self.ropes.append(ropes[key])

    def embed(self, ids: np.ndarray) -> np.ndarray:
        x = self.w.token_embd[ids]  # fancy indexing copies: the residual stream is ours
        if self.cfg.embd_scale is not None:
            x *= np.float32(self.cfg.embd_scale)
        return x

    def layer(self, layer: int, x: np.ndarray, positions: np.ndarray, cache) -> np.ndarray:
        cfg, w = self.cfg, self.w.layers[layer]
        shape = self.shapes[layer]
        h = rms_norm(x, w.attn_norm, cfg.norm_eps)
        if shape.mixer == "gdn":
            a = gdn(h, w.gdn, cfg, cache.slot(layer))
        else:
            a = attention(h, w, cfg, shape, self.ropes[layer], positions, cache.slot(layer))
        if w.post_attn_norm is not None:
            rms_norm(a, w.post_attn_norm, cfg.norm_eps, out=a)
        # A new residual array: the caller's x is left as it was; from here on it is ours.
        x = x + a
        h = rms_norm(x, w.ffn_norm, cfg.norm_eps)
        if shape.ffn == "moe":
            f = moe_ffn(h, w.moe, cfg)
        else:
            f = dense_ffn(h, w.gate_up, w.down, cfg.ffn_act)
        if w.post_ffn_norm is not None:
            rms_norm(f, w.post_ffn_norm, cfg.norm_eps, out=f)
        x += f
        return x

    def logits(self, x: np.ndarray) -> np.ndarray:
        h = rms_norm(x, self.w.output_norm, self.cfg.norm_eps)
        out = linear(h, self.w.output)
        cap = self.cfg.final_logit_softcap
        if cap:
            out /= np.float32(cap)
            np.tanh(out, out=out)
            out *= np.float32(cap)
        return out
