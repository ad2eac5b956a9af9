"""Weight matmuls: x [T, in] -> x @ W.T + b over a (possibly fused) Linear."""

from __future__ import annotations

import numpy as np

from ..model.weights import Linear


def linear(x: np.ndarray, lin: Linear) -> np.ndarray:
    y = x @ lin.w.T
    if lin.b is not None:
        y += lin.b
    return y
