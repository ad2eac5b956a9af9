"""The backend-neutral model: configuration, per-layer shapes, weights."""

from .config import LayerShape, ModelConfig
from .weights import LayerWeights, ModelWeights, load_weights

__all__ = [
    "LayerShape",
    "LayerWeights",
    "ModelConfig",
    "ModelWeights",
    "load_weights",
]
