"""Per-layer caches behind one protocol (protocol.py): full-attention K/V, a sliding-window
K/V that keeps only its window, a chunked-attention K/V that keeps its chunk, an MLA layer's
latent rows (latent.py), and gated-delta-net recurrent state; KvCache holds one slot per
layer and the sequence's length."""

from .attention import AttentionKv, ChunkKv, WindowKv
from .batch import BatchSlot, SeqBatch
from .kv_cache import CacheSnapshot, KvCache
from .protocol import KvSlot, LayerSlot, RecurrentSlot
from .recurrent import RecurrentState

__all__ = [
    "AttentionKv",
    "BatchSlot",
    "CacheSnapshot",
    "ChunkKv",
    "KvCache",
    "KvSlot",
    "LayerSlot",
    "RecurrentSlot",
    "RecurrentState",
    "SeqBatch",
    "WindowKv",
]
