"""RMSNorm as llama.cpp computes it: x / sqrt(mean(x^2) + eps) * w, in f32."""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Normalize over the last axis (rows of hidden states, or heads' rows for QK norm)."""
    ms = np.einsum("...i,...i->...", x, x) / np.float32(x.shape[-1])
    scale = 1.0 / np.sqrt(ms + np.float32(eps), dtype=np.float32)
    return (x * scale[..., None]) * weight
