"""CudaBackend: the decoder loop's view of the dense stack.

plan() answers from eligibility.py alone (over the layers' traces, graph/trace.py), before
any cache or device memory is touched: the longest run of consecutive eligible layers from
`layer`, or a named refusal. run() takes the run in one stack call over the layers' device
KV caches, then pushes each layer's K/V rows into the host cache (the authoritative one)
through its slots. A run that reaches the last layer can bring the logits back instead of
the hidden rows (run_head), so a decode token whose every layer is carried is one
submission. Anything that goes wrong inside the stack is a launch failure: it is raised as
LaunchFailed before a single host cache row is written, and the decoder loop has the host
body run the same layers.

The device KV cache is a per-sequence mirror of the host cache, kept resident so decode
rows and later prompt chunks do not upload the prefix again. It re-syncs a layer from the
host, through the layer's cache slot, when its length or the slot's write count (version)
says the host rows changed behind it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...graph.rope import rope_factors, rope_frequencies
from ...graph.trace import Source
from ...model.config import ModelConfig
from ...model.weights import LayerWeights, ModelWeights
from ..base import DeviceBackend
from ..ledger import Ledger
from ..protocol import Run
from . import eligibility
from .cuda_ops import CudaOps, CudaStep
from .stack import DeviceHead, dense_stack, upload_head, upload_layer

F32 = np.float32
# The smallest device KV cache a sequence gets; it doubles (up to the context) as it fills.
MIN_CACHE_ROWS = 256


class _Mirror:
    """One sequence's device KV cache: per carried layer K [Hkv, rows, hd_k] and
    V [Hkv, rows, hd_v], how many rows are valid, and the host write count they match."""

    def __init__(self, n_layer: int) -> None:
        self.rows = 0
        self.k: list[Any] = [None] * n_layer
        self.v: list[Any] = [None] * n_layer
        self.length = [0] * n_layer
        self.version = [-1] * n_layer


def _device_errors() -> tuple[type[BaseException], ...]:
    """CuPy's own failures (CUDA driver/runtime errors subclass RuntimeError, its
    OutOfMemoryError MemoryError; NVRTC's CompileException neither), never a Python bug."""
    errors: tuple[type[BaseException], ...] = (RuntimeError, MemoryError)
    try:
        from cupy.cuda.compiler import CompileException
    except ImportError:
        return errors
    return (*errors, CompileException)


class CudaBackend(DeviceBackend):
    name = "cuda"

    def __init__(
        self,
        cfg: ModelConfig,
        ops: Any,
        weight_dtype: Any = F32,
        ledger: Ledger | None = None,
        source: Source = None,
    ) -> None:
        """source: what the layers' traces read the weights from (the checkpoint, when
        there is one; else the shapes the config implies)."""
        self.source = source
        self.ops = ops  # the kernel table: ReferenceOps or KernelOps
        self.weight_dtype = np.dtype(weight_dtype)
        self.device_errors = _device_errors()
        super().__init__(cfg, ledger)
        self._inv_freq: dict[tuple[float, float, bool], tuple[np.ndarray, float]] = {}

    @property
    def ops(self) -> Any:
        return self._ops

    @ops.setter
    def ops(self, ops: Any) -> None:
        # The composition's Ops (CudaOps) wrap the kernel table: swapping the table (the
        # tests put the CPU emulator's KernelOps in) must swap what the stack runs, or the
        # old table keeps running unseen.
        self._ops = ops
        self.cuda_ops = CudaOps(ops)

    @property
    def layer_refusals(self) -> list[str | None]:
        """Per layer, the refusal the ledger counts, or None (plan() reads this list)."""
        return self.refusal

    @property
    def layers(self) -> dict[int, LayerWeights]:
        return self.resident

    # -- load ----------------------------------------------------------------------------

    def layer_reasons(self, layer: int) -> list[str]:
        return eligibility.layer_reasons(self.cfg, layer, self.source)

    def prepare(self, weights: ModelWeights) -> None:
        self._weights_rope = (
            weights.rope_freqs,
            weights.rope_factors_long,
            weights.rope_factors_short,
        )

    def upload_layer(self, layer: int, lw: Any) -> LayerWeights:
        # The NumPy stand-in's to_device may alias the host arrays; the store's release
        # then frees nothing.
        return upload_layer(self.ops, lw, self.weight_dtype)

    def upload_head(self, weights: ModelWeights) -> DeviceHead:
        return upload_head(
            self.ops, weights.output_norm, weights.output, self.weight_dtype, weights.output_norm_b
        )

    def new_mirror(self) -> _Mirror:
        return _Mirror(self.cfg.n_layer)

    def step_refusal(
        self, kind: str, n_rows: int, cache: Any, positions: np.ndarray | None, layers: range
    ) -> str | None:
        return eligibility.step_refusal(self.cfg, kind, n_rows, cache, positions, layers)

    # -- the device KV cache ---------------------------------------------------------------

    def _mirror(self, cache: Any, rows_needed: int, layers: range) -> _Mirror:
        """The sequence's device KV cache with room for rows_needed rows, every layer of
        `layers` holding exactly the host cache's committed rows."""
        ops, xp, cfg = self.ops, self.ops.xp, self.cfg
        m = self.mirror(cache)
        if rows_needed > m.rows:
            rows = max(MIN_CACHE_ROWS, m.rows)
            while rows < rows_needed:
                rows *= 2
            rows = min(rows, max(cache.n_ctx, rows_needed))
            for i in range(cfg.n_layer):  # grow on the device, keeping the valid rows
                if m.k[i] is not None:
                    n_kv = m.k[i].shape[0]  # the layer's own KV heads
                    k = xp.empty((n_kv, rows, cfg.head_dim_k), F32)
                    v = xp.empty((n_kv, rows, cfg.head_dim_v), F32)
                    k[:, : m.length[i]] = m.k[i][:, : m.length[i]]
                    v[:, : m.length[i]] = m.v[i][:, : m.length[i]]
                    m.k[i], m.v[i] = k, v
            m.rows = rows
        n = cache.n_past
        for i in layers:
            slot = cache.slot(i)
            if m.k[i] is None:
                n_kv = cfg.layer_shape(i).n_head_kv  # per layer (layer_sizes)
                m.k[i] = xp.empty((n_kv, m.rows, cfg.head_dim_k), F32)
                m.v[i] = xp.empty((n_kv, m.rows, cfg.head_dim_v), F32)
            if m.version[i] == slot.version and m.length[i] >= n:
                # The host rows are the ones this mirror wrote; a truncated cache only
                # shortens them.
                m.length[i] = n
                continue
            # The mirror is indexed by position. A window layer's host slot no longer holds
            # the rows before its window; here they stay stale, hidden by the window mask.
            # They are zeroed rather than left uninitialized: the kernel never reads them,
            # but the NumPy reference scores every row before masking, and NaN would leak.
            first, k, v = slot.held()
            if first:
                m.k[i][:, :first] = 0
                m.v[i][:, :first] = 0
            if n > first:
                m.k[i][:, first:n] = ops.to_device(k)
                m.v[i][:, first:n] = ops.to_device(v)
            m.length[i], m.version[i] = n, slot.version
        return m

    # -- the run -----------------------------------------------------------------------------

    def _rope_tables(
        self, layer: int, positions: np.ndarray, n_ctx: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """cos/sin [T, rope_dim/2] at the batch's positions, computed as the host body's Rope
        computes its tables (graph.rope.rope_frequencies: float64 angles, YaRN / LongRoPE's
        multiplier, rounded once), so both rotate identically."""
        cfg = self.cfg
        shape = cfg.layer_shape(layer)
        long = cfg.rope_scaling is not None and cfg.rope_scaling.long(n_ctx)
        key = (shape.rope_base, shape.rope_scale, long)
        if key not in self._inv_freq:
            factors = rope_factors(cfg, *self._weights_rope, n_ctx)
            self._inv_freq[key] = rope_frequencies(
                cfg.rope_dim, shape.rope_base, shape.rope_scale, factors, cfg.rope_scaling
            )
        inv, mscale = self._inv_freq[key]
        ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
        cos, sin = np.cos(ang), np.sin(ang)
        if mscale != 1.0:
            cos, sin = cos * mscale, sin * mscale
        return cos.astype(F32), sin.astype(F32)

    def launch(
        self, run: Run, x: np.ndarray, positions: np.ndarray, cache: Any, head: str | None
    ) -> np.ndarray:
        layers = range(run.start, run.stop)
        n_past = cache.n_past
        T = x.shape[0]
        shapes = [self.cfg.layer_shape(i) for i in layers]
        keys = [(s.rope_base, s.rope_scale) for s in shapes]
        neox = self.cfg.rope_type == "neox"
        tables: dict[Any, tuple[Any, Any, int, bool]] = {}
        for i, key in zip(layers, keys):
            if key not in tables:
                cos, sin = self._rope_tables(i, positions, cache.n_ctx)
                tables[key] = (
                    self.ops.to_device(cos),
                    self.ops.to_device(sin),
                    self.cfg.rope_dim,
                    neox,
                )
        m = self._mirror(cache, n_past + T, layers)
        out = dense_stack(
            self.cuda_ops,
            self.cfg,
            [self.resident[i] for i in layers],
            shapes,
            keys,
            CudaStep(n_past, tables),
            x,
            [(m.k[i], m.v[i]) for i in layers],
            head=None if head is None else self.head,
            all_logits=head == "all",
        )
        kind = "prefill-stack" if T > 1 else "decode-stack"
        self.ledger.submit(kind if head is None else kind + "+lm-head")
        # Only now, with every layer back, do the host cache and the mirror's lengths move.
        for i, k, v in zip(layers, out.k_rows, out.v_rows):
            slot = cache.slot(i)
            slot.write(n_past, k, v)
            m.length[i], m.version[i] = n_past + T, slot.version
        return out.main
