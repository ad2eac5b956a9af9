"""The backend-neutral model: configuration, per-layer shapes, weights."""

from .config import LayerShape, ModelConfig, config_from_checkpoint
from .weights import LayerWeights, ModelWeights, load_weights

__all__ = [
    "LayerShape",
    "LayerWeights",
    "ModelConfig",
    "ModelWeights",
    "config_from_checkpoint",
    "load_weights",
]
