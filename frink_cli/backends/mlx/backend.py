"""MlxBackend: runs of layers (and the lm head) as compiled MLX graphs, one eval each.

Weights are uploaded once at bind() and stay resident: Q4_0..Q8_0, Q4_K, Q5_K tensors as
MLX affine-quantized integers and MXFP4 as MLX's mxfp4, both taken from the file's own
blocks (quant.py), F16/BF16 as they are, everything else as the host body's f32. MoE expert
stacks follow the same rule and are multiplied in place (graph.DeviceExperts), never
gathered per token. A run's K/V are attended on the device from a per-sequence mirror of
the host cache; the host cache stays authoritative: every new K/V row comes back with the
run's output in the same transfer and is written to it, and a mirror layer whose length
differs from the host's is re-uploaded before use.

A submission is one mx.eval. Each run makes exactly one; its results are then read with
np.asarray, which copies already-evaluated memory and does not synchronize again. A
multi-sequence step (cache.SeqBatch) is one submission too: every sequence's rows go
through the linears together, each sequence's history ops read its own mirror, and the
lm head reads each sequence's last row, all in one traced graph.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ...cache.kv_types import F32_CACHE, CacheTypes, as_f32
from ...graph.blocks.step import BatchSlot, SeqRows
from ...graph.rope import rope_factors, rope_frequencies
from ...model.config import ModelConfig
from ...model.lora import LoraAdapter
from ...model.weights import LayerWeights
from ..base import DeviceBackend
from ..protocol import Run
from . import graph
from .eligibility import layer_refusals
from .graph import MLX_OPS
from .lora import step_scales, traced_scales
from .upload import WeightUpload

_MIN_CAPACITY = 256
# Rows per prefill submission. A GDN layer's recurrence is unrolled row by row in the
# traced graph, so runs holding one take smaller chunks.
PREFILL_CHUNK = 512
GDN_CHUNK = 64
BATCH_OVER_CHUNK = "multi-sequence step over one submission's rows"
_NO_LORA = np.zeros((1, 1), np.float32)  # the scales input of a model without adapters


class _Mirror:
    """One sequence's device K/V: per layer [1, Hkv, capacity, hd] and its valid length."""

    def __init__(self, n_layer: int) -> None:
        self.capacity = 0
        self.k: list[mx.array | None] = [None] * n_layer
        self.v: list[mx.array | None] = [None] * n_layer
        self.length = [-1] * n_layer
        # The write count (its cache slot's version) each layer's rows match.
        self.version = [-1] * n_layer
        # Recurrent layers: the host state arrays the device state was made from / made.
        self.host_state: list[tuple | None] = [None] * n_layer
        # Layers with attention and a mamba mixer side by side: the device conv
        # tail and scan state beside the K/V mirror in k / v.
        self.rec: list[tuple[mx.array, mx.array] | None] = [None] * n_layer


@dataclass(frozen=True)
class _Part:
    """One submission's rows of one sequence: the sequence (its index in the step), where
    these rows start among its new rows, and how many."""

    seq: int
    offset: int
    count: int


def _state_rows(
    flat: np.ndarray, at: int, tail: mx.array, state: mx.array
) -> tuple[np.ndarray, np.ndarray]:
    """A recurrent layer's new conv tail and state, host copies of their rows in flat."""
    n = tail.size
    return (
        flat[at : at + n].reshape(tail.shape).copy(),
        flat[at + n : at + n + state.size].reshape(state.shape).copy(),
    )


class MlxBackend(WeightUpload, DeviceBackend):
    name = "metal"
    runs_batches = True
    runs_lora = True

    def __init__(
        self, cfg: ModelConfig, checkpoint=None, cache_types: CacheTypes = F32_CACHE
    ) -> None:
        self.checkpoint = checkpoint
        self.cache_types = cache_types  # f32, f16 or bf16 mirrors (capabilities.py)
        super().__init__(cfg)
        self.tensor_choice: dict[str, str] = {}  # per source type: how the device holds it
        self.tensor_held: dict[str, str] = {}  # per source tensor the device holds: how
        # Tensors of a QUANTIZED_TYPES type whose blocks MLX would not reproduce: why dense.
        self._not_exact: dict[str, str] = {}
        self._names: set[str] | None = None
        self._compiled: dict[tuple, object] = {}
        self.lora_index: dict[LoraAdapter, int] = {}

    def layer_reasons(self, layer: int) -> list[str]:
        return layer_refusals(self.cfg, layer, self.checkpoint)

    @property
    def refusals(self) -> list[list[str]]:
        return self.reasons

    @property
    def layers(self) -> list[LayerWeights | None]:
        """Per layer, its resident weights, or None where the host body runs it."""
        return [self.resident.get(i) for i in range(self.cfg.n_layer)]

    def prepare(self, weights) -> None:
        cfg = self.cfg
        self.shapes = [cfg.layer_shape(i) for i in range(cfg.n_layer)]
        self._weights_rope = (
            weights.rope_freqs,
            weights.rope_factors_long,
            weights.rope_factors_short,
        )
        self._ropes: dict[bool, list[graph.DeviceRope]] = {}
        self.ropes = self.ropes_for(0)

    def ropes_for(self, n_ctx: int) -> list[graph.DeviceRope]:
        """Each layer's rope for a context of n_ctx (LongRoPE switches on it). Plain rope
        keeps mx.fast.rope's base; any per-pair change (llama3's rope_freqs, YaRN, LongRoPE)
        goes in as freqs, the periods graph.rope.rope_frequencies computes."""
        cfg = self.cfg
        long = cfg.rope_scaling is not None and cfg.rope_scaling.long(n_ctx)
        if long not in self._ropes:
            factors = rope_factors(cfg, *self._weights_rope, n_ctx)
            ropes = []
            for s in self.shapes:
                f = None if s.no_rope_freqs else factors  # a layer the factors skip
                if f is None and cfg.rope_scaling is None:
                    freqs, base, scale, mscale = None, s.rope_base, s.rope_scale, 1.0
                else:
                    inv, mscale = rope_frequencies(
                        s.rope_dim, s.rope_base, s.rope_scale, f, cfg.rope_scaling
                    )
                    freqs, base, scale = mx.array((1.0 / inv).astype(np.float32)), None, 1.0
                ropes.append(
                    graph.DeviceRope(
                        s.rope_dim, cfg.rope_type == "norm", base, scale, freqs, mscale
                    )
                )
            self._ropes[long] = ropes
        return self._ropes[long]

    def end_thread(self) -> None:
        # MLX gives each thread that evaluates its own stream and worker; one still alive
        # when the interpreter exits ends the process in std::terminate (rc 134).
        mx.synchronize()
        mx.clear_streams()

    def new_mirror(self) -> _Mirror:
        return _Mirror(self.cfg.n_layer)

    # --- running ------------------------------------------------------------------------

    def _mirror(self, cache, rows_needed: int) -> _Mirror:
        m = self.mirror(cache)
        if rows_needed > m.capacity:
            cap = max(_MIN_CAPACITY, m.capacity)
            while cap < rows_needed:
                cap *= 2
            m.capacity = min(cap, max(cache.n_ctx, rows_needed))
            m.length = [-1] * self.cfg.n_layer  # re-upload from the host on next use
        return m

    def _parallel(self, layer: int) -> bool:
        """Attention and a mamba mixer side by side: K/V rows and a recurrent state."""
        return self.shapes[layer].mixer == "attention+mamba2"

    def _sync_layer(self, m: _Mirror, cache, layer: int) -> None:
        slot = cache.slot(layer)
        if self._parallel(layer):
            conv, delta = slot.recurrent_state()
            ref = m.host_state[layer]
            if ref is None or ref[0] is not conv or ref[1] is not delta:
                m.rec[layer] = (mx.array(conv), mx.array(delta))
                m.host_state[layer] = (conv, delta)
        elif self.cfg.is_recurrent(layer):
            # This step's staged state if an earlier run of it already moved the layer on.
            conv, delta = slot.recurrent_state()
            ref = m.host_state[layer]
            if ref is None or ref[0] is not conv or ref[1] is not delta:
                m.k[layer], m.v[layer] = mx.array(conv), mx.array(delta)
                m.host_state[layer] = (conv, delta)
            return
        if self._shares_kv(layer):
            return  # a KV-sharing layer reads its source's mirror
        n = cache.n_past
        if m.length[layer] == n and m.version[layer] == slot.version:
            return
        shape = self.shapes[layer]
        first, hk, hv = slot.held()
        types = self.cache_types
        m.k[layer] = self._upload(hk, types.k, shape.head_dim_k, first, n, m.capacity)
        m.v[layer] = self._upload(hv, types.v, shape.head_dim_v, first, n, m.capacity)
        m.length[layer], m.version[layer] = n, slot.version

    @staticmethod
    def _upload(rows, kind: str, width: int, first: int, n: int, capacity: int) -> mx.array:
        """A slot's held rows (positions first..n) as a mirror [1, Hkv, capacity, width] of
        cache type `kind`. The mirror is indexed by position: a window layer's slot no longer
        holds the rows before its window, and they stay zero here, hidden by the window mask."""
        f16 = kind == "f16"
        buf = np.zeros((1, rows.shape[0], capacity, width), np.float16 if f16 else np.float32)
        buf[0, :, first:n] = rows.data if f16 else as_f32(rows)  # f16: the stored rows
        # bf16: exact (the rows are bf16 values already).
        return mx.array(buf).astype(mx.bfloat16) if kind == "bf16" else mx.array(buf)

    def _shares_kv(self, layer: int) -> bool:
        """A KV-sharing layer: no device state of its own."""
        return self.shapes[layer].kv_source is not None

    def _recurrent(self, layers: range) -> bool:
        return any(self.cfg.is_recurrent(i) for i in layers)

    def step_refusal(
        self, kind: str, n_rows: int, cache, positions: np.ndarray | None, layers: range
    ) -> str | None:
        # A multi-sequence step is one submission, never chunked: rows past a chunk go to the
        # host (a server's long prompt rides alone, where launch chunks it).
        limit = GDN_CHUNK if self._recurrent(layers) else PREFILL_CHUNK
        if kind == "batch" and n_rows > limit:
            return BATCH_OVER_CHUNK
        for i in layers:
            source = self.shapes[i].kv_source
            if source is not None and source not in layers:
                # Its rows live in the source's state, which only a run holding both has.
                return f"layer {i} shares the K/V of layer {source}, outside this run"
        return None

    def _function(
        self,
        run: Run,
        counts: tuple[int, ...],
        capacities: tuple[int, ...],
        head: str | None,
        n_ctx: int,
    ):
        """The traced run over the rows of len(counts) sequences (counts[j] rows each, in
        order), sequence j's mirrors of capacities[j] rows."""
        ropes = self.ropes_for(n_ctx)
        key = (run.start, run.stop, counts, capacities, head, id(ropes))
        fn = self._compiled.get(key)
        if fn is None:
            cfg = self.cfg
            bounds = list(
                zip(itertools.accumulate(counts, initial=0), itertools.accumulate(counts))
            )

            def forward(x, positions, starts, scales, *kv):
                # scales: the LoRA adapters' [1 or rows, adapters] (lora.py; unused without).
                seqs = [
                    graph.StepContext(positions[a:b], starts[j]) for j, (a, b) in enumerate(bounds)
                ]
                with traced_scales(scales):
                    x, new_kv, rows = self._trace_layers(run, x, positions, seqs, bounds, kv, ropes)
                main = x
                if head is not None:
                    norm, output, norm_b = self.head
                    # "last": each sequence's last row (where its next token comes from).
                    last_rows = mx.array([b - 1 for _, b in bounds])
                    last = x if head == "all" else x[last_rows]
                    if head == "last" and scales.shape[0] > 1:
                        scales = scales[last_rows]
                    with traced_scales(scales):
                        main = cfg.ext.head(MLX_OPS, cfg, norm, output, last, norm_b)
                return (mx.concatenate([main.reshape(-1)] + rows), *new_kv)

            fn = self._compiled[key] = mx.compile(forward)
        return fn

    def _trace_layers(
        self,
        run: Run,
        x,
        positions,
        seqs: list,
        bounds: list[tuple[int, int]],
        kv: tuple,
        ropes: list[graph.DeviceRope],
    ) -> tuple:
        """Layers [run.start, run.stop) over the rows x, traced: (x after them, each layer's
        new state arrays per sequence, the flat rows the host caches take: attention's new
        K/V rows, a recurrent layer's new tail and state). kv holds each layer's state
        arrays per sequence, in order; seqs and bounds are each sequence's StepContext and
        row range."""
        cfg, layers = self.cfg, self.resident
        one = len(seqs) == 1
        # One sequence: the history ops and rope_ read its own context; several: the
        # composition runs each history op per sequence (BatchSlot).
        pos = seqs[0] if one else graph.RowPositions(positions)
        new_kv: list = []
        rows: list = []
        at = 0
        states: dict[int, list[graph.LayerState]] = {}
        for i in range(run.start, run.stop):
            source = self.shapes[i].kv_source
            if source is not None:
                # KV sharing: the source layer's states, this step's rows in them.
                view = self._view(states[source], seqs, bounds)
                x = cfg.ext.layer(MLX_OPS, cfg, self.shapes[i], layers[i], x, pos, view, ropes[i])
                continue
            w = 4 if self._parallel(i) else 2
            sts = [graph.LayerState(*kv[at + j * w : at + (j + 1) * w]) for j in range(len(seqs))]
            states[i] = sts
            at += w * len(seqs)
            view = self._view(sts, seqs, bounds)
            x = cfg.ext.layer(MLX_OPS, cfg, self.shapes[i], layers[i], x, pos, view, ropes[i])
            for st in sts:
                new_kv += st.arrays()
                # Attention: the new K/V rows; a gated delta net: its new tail and
                # state (a parallel layer: its K/V rows, then its new tail and state).
                kr, vr = st.rows if st.rows is not None else (st.a, st.b)
                rows += [kr.reshape(-1), vr.reshape(-1)]
                if st.c is not None and st.d is not None:
                    rows += [st.c.reshape(-1), st.d.reshape(-1)]
        return x, new_kv, rows

    @staticmethod
    def _view(sts: list[graph.LayerState], seqs: list, bounds: list[tuple[int, int]]):
        """What a layer's history ops read: the one sequence's state, or each sequence's
        rows in its own state (BatchSlot)."""
        if len(sts) == 1:
            return sts[0]
        return BatchSlot([SeqRows(st, p, a, b) for st, p, (a, b) in zip(sts, seqs, bounds)])

    def launch(
        self, run: Run, x: np.ndarray, positions: np.ndarray, cache, head: str | None
    ) -> np.ndarray:
        """Run layers [run.start, run.stop) over the rows x. One sequence's rows (cache a
        KvCache) go in chunks of at most PREFILL_CHUNK rows: one traced graph serves every
        full chunk, and a GDN chunk's unrolled recurrence stays small. A multi-sequence
        step's (a cache.SeqBatch: several caches, each its count of rows) go as one chunk.
        One submission per chunk; the host caches and the mirrors change only after every
        chunk has succeeded. With head "last", each sequence's last row's logits."""
        cfg = self.cfg
        layers = range(run.start, run.stop)
        if hasattr(cache, "caches"):  # a cache.SeqBatch (backends do not import cache)
            caches, counts = cache.caches, cache.counts
            chunks = [[_Part(j, 0, n) for j, n in enumerate(counts)]]
        else:
            T = x.shape[0]
            caches, counts = [cache], [T]
            size = GDN_CHUNK if self._recurrent(layers) else PREFILL_CHUNK
            chunks = [[_Part(0, o, min(size, T - o))] for o in range(0, T, size)]
        mirrors = [self._mirror(c, c.n_past + n) for c, n in zip(caches, counts)]
        scales = step_scales(list(self.lora_index), counts) if self.lora_index else _NO_LORA
        # This launch's device state per (sequence, layer), carried chunk to chunk.
        state = self._device_state(layers, caches, mirrors)
        staged = []
        row = 0
        for parts in chunks:
            n = sum(p.count for p in parts)
            h = head if head == "all" or (head == "last" and row + n == len(x)) else None
            fn = self._function(
                run,
                tuple(p.count for p in parts),
                tuple(mirrors[p.seq].capacity for p in parts),
                h,
                caches[0].n_ctx,
            )
            starts = [caches[p.seq].n_past + p.offset for p in parts]
            outs = fn(
                mx.array(x[row : row + n]),
                mx.array(positions[row : row + n].astype(np.int32)),
                mx.array(np.asarray(starts, np.int32)),
                mx.array(scales if len(scales) == 1 else scales[row : row + n]),
                *[a for i in layers for p in parts for a in state[p.seq, i]],
            )
            mx.eval(outs)
            self.ledger.submit(self._kind(run, h, len(parts) > 1))
            at = 1  # outs: the flat rows, then each layer's state arrays, per sequence
            for i in layers:
                for p in parts:
                    w = len(state[p.seq, i])
                    state[p.seq, i] = tuple(outs[at : at + w])
                    at += w
            staged.append((parts, h, np.asarray(outs[0])))
            row += n
        # Every chunk succeeded: only now do the host caches and the mirrors change.
        outputs = []
        for parts, h, flat in staged:
            width = cfg.n_vocab if h else cfg.residual_width
            at = (len(parts) if h == "last" else sum(p.count for p in parts)) * width
            if h is not None or head is None:
                outputs.append(flat[:at].reshape(-1, width))
            for i in layers:
                for p in parts:
                    c = caches[p.seq]
                    last = p.offset + p.count == counts[p.seq]
                    at = self._write_back(i, c, mirrors[p.seq], p, last, flat, at, state[p.seq, i])
        for i in layers:
            if self._shares_kv(i):
                continue
            if not cfg.is_recurrent(i) or self._parallel(i):
                for j, (c, m) in enumerate(zip(caches, mirrors)):
                    m.k[i], m.v[i] = state[j, i][0], state[j, i][1]
                    m.length[i], m.version[i] = c.n_past + counts[j], c.slot(i).version
        return np.concatenate(outputs) if len(outputs) > 1 else outputs[0]

    def _device_state(
        self, layers: range, caches: list, mirrors: list[_Mirror]
    ) -> dict[tuple[int, int], tuple[mx.array, ...]]:
        """Per (sequence, layer) the device state a run starts from, each mirror brought up
        to its host cache first: K/V (and a parallel layer's tail and state), a recurrent
        layer's tail and state, nothing for a KV-sharing layer (its source's, in the run)."""
        state: dict[tuple[int, int], tuple[mx.array, ...]] = {}
        for i in layers:
            for j, (c, m) in enumerate(zip(caches, mirrors)):
                if self._shares_kv(i):
                    state[j, i] = ()  # no state of its own: its source's, in the run
                    continue
                self._sync_layer(m, c, i)
                dk, dv = m.k[i], m.v[i]
                assert dk is not None and dv is not None  # _sync_layer has just uploaded them
                rec = m.rec[i] if self._parallel(i) else None
                state[j, i] = (dk, dv) if rec is None else (dk, dv, *rec)
        return state

    def _write_back(
        self,
        i: int,
        cache,
        m: _Mirror,
        p: _Part,
        last: bool,
        flat: np.ndarray,
        at: int,
        st: tuple[mx.array, ...],
    ) -> int:
        """Layer i's results for rows p, read from flat at offset `at`, into the sequence's
        host cache slot: its new K/V rows at their positions and, after the sequence's last
        rows, its recurrent state (st: the device state the step ended in, which the mirror
        keeps). Returns the offset past them."""
        cfg = self.cfg
        slot = cache.slot(i)
        if self._shares_kv(i):
            return at  # it wrote no rows (its source did)
        if cfg.is_recurrent(i) and not self._parallel(i):
            if last:  # the state after the last chunk is the layer's new state
                host = _state_rows(flat, at, st[0], st[1])
                slot.set_recurrent_state(*host)  # current at commit
                m.k[i], m.v[i], m.host_state[i] = st[0], st[1], host
            return at + st[0].size + st[1].size
        shape = self.shapes[i]
        n_kv, c, hk, hv = shape.n_head_kv, p.count, shape.head_dim_k, shape.head_dim_v
        nk, nv = n_kv * c * hk, n_kv * c * hv  # per layer (0: no rows)
        k = flat[at : at + nk].reshape(n_kv, c, hk).transpose(1, 0, 2)
        v = flat[at + nk : at + nk + nv].reshape(n_kv, c, hv).transpose(1, 0, 2)
        at += nk + nv
        slot.write(cache.n_past + p.offset, k, v)
        if self._parallel(i):  # its new tail and state follow its K/V rows
            if last:
                host = _state_rows(flat, at, st[2], st[3])
                slot.set_recurrent_state(*host)  # current at commit
                m.rec[i], m.host_state[i] = (st[2], st[3]), host
            at += st[2].size + st[3].size
        return at

    def _kind(self, run: Run, head: str | None, batch: bool = False) -> str:
        """Ledger tag: a run of mamba layers is a mamba-run; of a model with short convs, a
        shortconv-run (its attention layers folded in), with lightning attention a
        lightning-run (likewise); a run holding GDN layers is a gdn-run (its attention
        layers are the heads and tails folded into it), else a dense-run; "+batch" over
        several sequences; "+lm-head" when the head rode along."""
        recurrent = self._recurrent(range(run.start, run.stop))
        mixers = {s.mixer for s in self.shapes}
        kind = (
            "mamba"
            if mixers & {"mamba", "mamba2", "attention+mamba2"}
            else "shortconv"
            if "shortconv" in mixers
            else "lightning"
            if "lightning" in mixers
            else "gdn"
            if recurrent
            else "dense"
        )
        return f"{kind}-run" + ("+batch" if batch else "") + ("" if head is None else "+lm-head")
