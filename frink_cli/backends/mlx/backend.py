"""MlxBackend: runs of layers (and the lm head) as compiled MLX graphs, one eval each.

Weights are uploaded once at bind() and stay resident: Q4_0/Q4_1/Q8_0 tensors as MLX
affine-quantized integers taken from the file's own blocks (quant.py), F16/BF16 as they
are, everything else as the host body's f32. A run's K/V are attended on the device from
a per-sequence mirror of the host cache; the host cache stays authoritative: every new K/V
row comes back with the run's output in the same transfer and is written to it, and a
mirror layer whose length differs from the host's is re-uploaded before use.

A submission is one mx.eval. Each run makes exactly one; its results are then read with
np.asarray, which copies already-evaluated memory and does not synchronize again.
"""

from __future__ import annotations

import weakref

import mlx.core as mx
import numpy as np

from ...model.config import ModelConfig
from .. import LaunchFailed, Refusal, Run
from ..ledger import Ledger
from . import graph
from .eligibility import layer_refusals
from .quant import QUANTIZED_TYPES, affine_from_blocks, device_format, pack

_MIN_CAPACITY = 256
# Rows per prefill submission. A GDN layer's recurrence is unrolled row by row in the
# traced graph, so runs holding one take smaller chunks.
PREFILL_CHUNK = 512
GDN_CHUNK = 64


class _Mirror:
    """One sequence's device K/V: per layer [1, Hkv, capacity, hd] and its valid length."""

    def __init__(self, n_layer: int) -> None:
        self.capacity = 0
        self.k: list[mx.array | None] = [None] * n_layer
        self.v: list[mx.array | None] = [None] * n_layer
        self.length = [-1] * n_layer
        # The host cache's write count (KvCache.versions) each layer's rows match.
        self.version = [-1] * n_layer
        # Recurrent layers: the host state arrays the device state was made from / made.
        self.host_state: list[tuple | None] = [None] * n_layer


class MlxBackend:
    name = "metal"
    runs_head = True

    def __init__(self, cfg: ModelConfig, checkpoint=None) -> None:
        self.cfg = cfg
        self.checkpoint = checkpoint
        self.ledger = Ledger()
        self.refusals = [layer_refusals(cfg, i) for i in range(cfg.n_layer)]
        self.tensor_choice: dict[str, str] = {}
        self._mirrors: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._compiled: dict[tuple, object] = {}

    # --- upload -------------------------------------------------------------------------

    def _linear(self, names: list[str], dense: np.ndarray, bias: np.ndarray | None) -> graph.DeviceLinear:
        """Device copy of a (fused) host Linear; quantized when every source tensor maps."""
        b = mx.array(bias) if bias is not None else None
        src = self.checkpoint.tensors if self.checkpoint is not None else None
        if src is None or not names or not set(names) <= set(src.names()):
            return graph.DeviceLinear(mx.array(dense), bias=b)  # no single source tensor to map
        dtypes = [src.info(n).dtype for n in names]
        if src is not None and hasattr(src, "raw") and len(set(dtypes)) == 1 and dtypes[0] in QUANTIZED_TYPES:
            qs, scales, biases = [], [], []
            for n in names:
                qtype, shape, raw = src.raw(n)
                q, s, bb, bits = affine_from_blocks(raw, dtypes[0], shape[0], shape[1])
                qs.append(pack(q, bits))
                scales.append(s)
                biases.append(bb)
            self.tensor_choice[dtypes[0]] = device_format(dtypes[0])
            return graph.DeviceLinear(
                mx.array(np.concatenate(qs)), mx.array(np.concatenate(scales)),
                mx.array(np.concatenate(biases)), bits, b,
            )
        kind = dtypes[0] if len(set(dtypes)) == 1 else "mixed"
        if kind == "F16":
            w = mx.array(dense.astype(np.float16))
        elif kind == "BF16":
            w = mx.array(dense).astype(mx.bfloat16)
        else:
            w = mx.array(dense)
        for d in set(dtypes):
            # A type that maps onto MLX's format but sits in a mixed fused matrix goes dense.
            self.tensor_choice.setdefault(d, device_format(d) if d not in QUANTIZED_TYPES or kind == d else "f32 (dequantized at load; fused with other types)")
        return graph.DeviceLinear(w, bias=b)

    def bind(self, weights) -> None:
        cfg = self.cfg
        names = set(self.checkpoint.tensors.names()) if self.checkpoint is not None else set()

        def opt(a):
            return mx.array(a) if a is not None else None

        self.layers: list[graph.DeviceLayer | None] = []
        for i, lw in enumerate(weights.layers):
            if self.refusals[i]:
                self.layers.append(None)
                continue
            p = f"blk.{i}."
            s = cfg.layer_shape(i)
            layer = graph.DeviceLayer(
                mixer=s.mixer, ffn=s.ffn,
                attn_norm=mx.array(lw.attn_norm), qkv=None, q_norm=opt(lw.q_norm), k_norm=opt(lw.k_norm),
                wo=None, post_attn_norm=opt(lw.post_attn_norm), ffn_norm=mx.array(lw.ffn_norm),
                gate_up=None, down=None, post_ffn_norm=opt(lw.post_ffn_norm),
                rope_base=s.rope_base, rope_scale=s.rope_scale, window=s.window,
            )
            if s.mixer == "gdn":
                g = lw.gdn
                layer.gdn = graph.DeviceGdn(
                    in_proj=self._linear([], g.in_proj.w, g.in_proj.b), conv=mx.array(g.conv),
                    a=mx.array(g.a), dt_bias=mx.array(g.dt_bias), norm=mx.array(g.norm),
                    out=self._linear([], g.out.w, g.out.b), heads=mx.array(cfg.gdn_key_heads()),
                )
            else:
                qkv_names = [p + "attn_qkv.weight"] if p + "attn_qkv.weight" in names else [p + f"attn_{x}.weight" for x in "qkv"]
                layer.qkv = self._linear(qkv_names, lw.qkv.w, lw.qkv.b)
                layer.wo = self._linear([p + "attn_output.weight"], lw.wo.w, lw.wo.b)
            if s.ffn == "moe":
                e = lw.moe
                layer.moe = graph.DeviceMoe(
                    inp=self._linear([], e.inp.w, e.inp.b), gate_up_exps=mx.array(e.gate_up_exps),
                    down_exps=mx.array(e.down_exps),
                    down_shexp=self._linear([], e.down_shexp.w, e.down_shexp.b) if e.down_shexp is not None else None,
                )
            else:
                layer.gate_up = self._linear([p + "ffn_gate.weight", p + "ffn_up.weight"], lw.gate_up.w, None)
                layer.down = self._linear([p + "ffn_down.weight"], lw.down.w, None)
            self.layers.append(layer)
        out_name = "token_embd.weight" if cfg.tied_embeddings else "output.weight"
        self.output = self._linear([out_name], weights.output.w, None)
        self.output_norm = mx.array(weights.output_norm)
        self.rope_freqs = None
        if weights.rope_freqs is not None:
            i = np.arange(0, cfg.rope_dim, 2, dtype=np.float64) / cfg.rope_dim
            self.rope_freqs = mx.array((cfg.rope_base**i * weights.rope_freqs).astype(np.float32))

    # --- planning -----------------------------------------------------------------------

    def plan(self, kind: str, layer: int, n_rows: int, cache, positions=None) -> Run | Refusal:
        if self.refusals[layer]:
            return Refusal(self.refusals[layer][0])
        stop = layer
        while stop < self.cfg.n_layer and not self.refusals[stop]:
            stop += 1
        return Run(layer, stop)

    # --- running ------------------------------------------------------------------------

    def _mirror(self, cache, rows_needed: int) -> _Mirror:
        m = self._mirrors.get(cache)
        if m is None:
            m = self._mirrors[cache] = _Mirror(self.cfg.n_layer)
        if rows_needed > m.capacity:
            cap = max(_MIN_CAPACITY, m.capacity)
            while cap < rows_needed:
                cap *= 2
            m.capacity = min(cap, max(cache.n_ctx, rows_needed))
            m.length = [-1] * self.cfg.n_layer  # re-upload from the host on next use
        return m

    def _sync_layer(self, m: _Mirror, cache, layer: int) -> None:
        if self.cfg.is_recurrent(layer):
            # This step's staged state if an earlier run of it already moved the layer on.
            conv, delta = cache.pending_state.get(layer, (cache.conv_state[layer], cache.delta_state[layer]))
            ref = m.host_state[layer]
            if ref is None or ref[0] is not conv or ref[1] is not delta:
                m.k[layer], m.v[layer] = mx.array(conv), mx.array(delta)
                m.host_state[layer] = (conv, delta)
            return
        n = cache.n_past
        if m.length[layer] == n and m.version[layer] == cache.versions[layer]:
            return
        cfg = self.cfg
        k = np.zeros((1, cfg.n_head_kv, m.capacity, cfg.head_dim_k), np.float32)
        v = np.zeros((1, cfg.n_head_kv, m.capacity, cfg.head_dim_v), np.float32)
        k[0, :, :n] = cache.k[layer][:, :n]
        v[0, :, :n] = cache.v[layer][:, :n]
        m.k[layer], m.v[layer] = mx.array(k), mx.array(v)
        m.length[layer], m.version[layer] = n, cache.versions[layer]

    def _function(self, run: Run, T: int, capacity: int, head: str | None):
        key = (run.start, run.stop, T, capacity, head)
        fn = self._compiled.get(key)
        if fn is None:
            cfg, layers = self.cfg, self.layers
            n = run.stop - run.start

            def forward(x, positions, start, *kv):
                new_kv, rows = [], []
                for j, i in enumerate(range(run.start, run.stop)):
                    x, kc, vc, kr, vr = graph.layer(cfg, layers[i], x, positions, start, kv[2 * j], kv[2 * j + 1], self.rope_freqs)
                    new_kv += [kc, vc]
                    rows += [kr.reshape(-1), vr.reshape(-1)]
                main = x
                if head is not None:
                    main = graph.head(cfg, self.output_norm, self.output, x if head == "all" else x[-1:])
                return (mx.concatenate([main.reshape(-1)] + rows), *new_kv)

            fn = self._compiled[key] = mx.compile(forward)
            assert n > 0
        return fn

    def _launch(self, run: Run, x: np.ndarray, positions: np.ndarray, cache, head: str | None) -> np.ndarray:
        """Run layers [run.start, run.stop) over the rows x, in chunks of at most
        PREFILL_CHUNK rows: one traced graph serves every full chunk, and a GDN chunk's
        unrolled recurrence stays small. One submission per chunk; the host cache and the
        mirrors change only after every chunk has succeeded."""
        cfg = self.cfg
        T = x.shape[0]
        chunk = GDN_CHUNK if any(cfg.is_recurrent(i) for i in range(run.start, run.stop)) else PREFILL_CHUNK
        outputs, staged = [], []
        try:
            m = self._mirror(cache, cache.n_past + T)
            state = {}  # this launch's device state per layer, carried chunk to chunk
            for i in range(run.start, run.stop):
                self._sync_layer(m, cache, i)
                state[i] = (m.k[i], m.v[i])
            for o in range(0, T, chunk):
                c = min(chunk, T - o)
                last = o + c == T
                h = head if head == "all" or (head == "last" and last) else None
                fn = self._function(run, c, m.capacity, h)
                kv = [a for i in range(run.start, run.stop) for a in state[i]]
                outs = fn(mx.array(x[o : o + c]), mx.array(positions[o : o + c].astype(np.int32)),
                          mx.array(np.int32(cache.n_past + o)), *kv)
                mx.eval(outs)
                self.ledger.submit(self._kind(run, h))
                flat = np.asarray(outs[0])
                for j, i in enumerate(range(run.start, run.stop)):
                    state[i] = (outs[1 + 2 * j], outs[2 + 2 * j])
                staged.append((o, c, h, flat))
        except Exception as e:  # noqa: BLE001 - any device failure: the host body takes over
            raise LaunchFailed(f"mlx: {type(e).__name__}: {e}") from e
        # Every chunk succeeded: only now do the host cache and the mirrors change.
        for o, c, h, flat in staged:
            width = cfg.n_vocab if h else cfg.n_embd
            pos = (1 if h == "last" else c) * width
            if h is not None or head is None:
                outputs.append(flat[:pos].reshape(-1, width))
            nk, nv = cfg.n_head_kv * c * cfg.head_dim_k, cfg.n_head_kv * c * cfg.head_dim_v
            for i in range(run.start, run.stop):
                if cfg.is_recurrent(i):
                    (da, db), (na, nb) = state[i], (state[i][0].size, state[i][1].size)
                    if o + c == T:  # the state after the last chunk is the layer's new state
                        conv = flat[pos : pos + na].reshape(da.shape).copy()
                        delta = flat[pos + na : pos + na + nb].reshape(db.shape).copy()
                        cache.slot(i).set_recurrent_state(conv, delta)  # current at commit
                        m.k[i], m.v[i], m.host_state[i] = da, db, (conv, delta)
                    pos += na + nb
                    continue
                k = flat[pos : pos + nk].reshape(cfg.n_head_kv, c, cfg.head_dim_k).transpose(1, 0, 2)
                v = flat[pos + nk : pos + nk + nv].reshape(cfg.n_head_kv, c, cfg.head_dim_v).transpose(1, 0, 2)
                pos += nk + nv
                cache.slot(i).write(cache.n_past + o, k, v)
        for i in range(run.start, run.stop):
            if not cfg.is_recurrent(i):
                m.k[i], m.v[i] = state[i]
                m.length[i], m.version[i] = cache.n_past + T, cache.versions[i]
        return np.concatenate(outputs) if len(outputs) > 1 else outputs[0]

    def _kind(self, run: Run, head: str | None) -> str:
        """Ledger tag: a run holding GDN layers is a gdn-run (its attention layers are the
        heads and tails folded into it), else a dense-run; "+lm-head" when the head rode along."""
        gdn = any(self.cfg.is_recurrent(i) for i in range(run.start, run.stop))
        return ("gdn-run" if gdn else "dense-run") + ("" if head is None else "+lm-head")

    def run(self, run: Run, x: np.ndarray, positions: np.ndarray, cache) -> np.ndarray:
        return self._launch(run, x, positions, cache, None)

    def run_head(self, run: Run, x: np.ndarray, positions: np.ndarray, cache, all_rows: bool) -> np.ndarray:
        """A run ending at the last layer, with the lm head in the same submission."""
        return self._launch(run, x, positions, cache, "all" if all_rows else "last")
