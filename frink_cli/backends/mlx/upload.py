"""The metal backend's weights made resident: each (fused) Linear and MoE expert stack held
in the file's own blocks where MLX's quantized layouts reproduce them exactly (quant.py),
else dense in the file's float type, else as the host's f32; what was chosen per source
type and per tensor is recorded (tensor_choice, tensor_held) for `frink info`."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from ...model.linear import Linear
from ...model.lora import LoraAdapter
from ...model.weights import LayerWeights, MoeWeights, dequantized, map_layer
from ...quant.blocks import QuantRows
from . import graph
from .lora import device_lora
from .quant import QUANTIZED_TYPES, NotExact, Quantized, device_format, quantized_stack


class WeightUpload:
    """The upload half of MlxBackend (a mixin): its owner sets these attributes up."""

    checkpoint: Any
    tensor_choice: dict[str, str]  # per source type: how the device holds it
    tensor_held: dict[str, str]  # per source tensor the device holds: how
    # Tensors of a QUANTIZED_TYPES type whose blocks MLX would not reproduce: why dense.
    _not_exact: dict[str, str]
    _names: set[str] | None
    # The LoRA adapters its linears carry, numbered in upload order (lora.py: each one's
    # column of a run's scales input).
    lora_index: dict[LoraAdapter, int]

    def _source_names(self) -> set[str]:
        if self._names is None:
            self._names = (
                set(self.checkpoint.tensors.names()) if self.checkpoint is not None else set()
            )
        return self._names

    def _quantized(self, names: list[str]) -> Quantized | None:
        """The tensors `names` stacked along their output rows (axis -2; a 1-D tensor is one
        row), kept in the file's own blocks; None unless they all exist with one type one of
        MLX's quantized layouts holds exactly (quant.py), every block of them included."""
        src = self.checkpoint.tensors if self.checkpoint is not None else None
        if (
            src is None
            or not names
            or not hasattr(src, "raw")
            or not set(names) <= self._source_names()
        ):
            return None
        dtypes = {src.info(n).dtype for n in names}
        if len(dtypes) != 1 or not dtypes <= set(QUANTIZED_TYPES):
            return None
        dtype = dtypes.pop()
        parts = []
        for n in names:
            try:
                parts.append(quantized_stack(src.raw(n)[2], dtype, tuple(src.info(n).shape)))
            except NotExact as e:
                # The whole fused matrix goes dense: its parts are one matmul.
                for m in names:
                    self._not_exact[m] = f"f32 (dequantized at load: {n} has {e})"
                return None
        if len({p.w.ndim for p in parts}) != 1:
            return None
        for n in names:
            self.tensor_held[n] = device_format(dtype)
        self.tensor_choice[dtype] = device_format(dtype)
        if len(parts) == 1:
            return parts[0]
        biases = [p.biases for p in parts if p.biases is not None]
        return Quantized(
            np.concatenate([p.w for p in parts], axis=-2),
            np.concatenate([p.scales for p in parts], axis=-2),
            np.concatenate(biases, axis=-2) if biases else None,
            parts[0].bits,
            parts[0].mode,
        )

    @staticmethod
    def _resident(q: Quantized) -> tuple[mx.array, mx.array, mx.array | None]:
        """(w, scales, biases) of `q` as device arrays (no biases in mxfp4)."""
        return mx.array(q.w), mx.array(q.scales), None if q.biases is None else mx.array(q.biases)

    def _dense_kind(self, names: list[str]) -> str | None:
        """The one source type of `names` ("mixed" when they differ), recorded as held dense;
        None when they are not all source tensors."""
        if self.checkpoint is None or not names or not set(names) <= self._source_names():
            return None
        dtypes = [self.checkpoint.tensors.info(n).dtype for n in names]
        kind = dtypes[0] if len(set(dtypes)) == 1 else "mixed"
        for n, d in zip(names, dtypes):
            # A type that maps onto MLX's format but sits in a mixed fused matrix goes dense,
            # as does one whose blocks MLX would not reproduce.
            how = self._not_exact.get(n) or (
                device_format(d)
                if d not in QUANTIZED_TYPES or kind == d
                else "f32 (dequantized at load; fused with other types)"
            )
            self.tensor_choice.setdefault(d, how)
            self.tensor_held[n] = how
        return kind

    def _linear(
        self, names: list[str], host: np.ndarray | QuantRows, bias: np.ndarray | None
    ) -> graph.DeviceLinear:
        """Device copy of a (fused) host Linear; quantized when every source tensor maps.
        Sources of different types (a Q4_K_M file's Q4_K q/k beside a Q6_K v) become parts,
        each held by its own rule from its rows of the host's fused matrix (neighbours of one
        type share a part: q/k Q4_K is one matmul beside v's)."""
        b = mx.array(bias) if bias is not None else None
        src = self.checkpoint.tensors if self.checkpoint is not None else None
        if (
            len(names) > 1
            and src is not None
            and set(names) <= self._source_names()
            and len({src.info(n).dtype for n in names}) > 1
        ):
            dense = dequantized(host)
            parts, o = [], 0
            for _, run in itertools.groupby(names, key=lambda n: src.info(n).dtype):
                group = list(run)
                rows = sum(int(np.prod(src.info(n).shape[:-1])) for n in group)  # 1-D: one row
                parts.append(self._linear(group, dense[o : o + rows], None))
                o += rows
            assert o == dense.shape[0], (names, o, dense.shape)
            return graph.DeviceLinear(None, bias=b, parts=tuple(parts), sources=tuple(names))
        q = self._quantized(names)
        if q is not None:
            return graph.DeviceLinear(
                *self._resident(q), q.bits, b, sources=tuple(names), mode=q.mode
            )
        kind = self._dense_kind(names)  # None: no single source tensor to map
        dense = dequantized(host)  # the host's f32, or its blocks dequantized
        if kind == "F16":
            w = mx.array(dense.astype(np.float16))
        elif kind == "BF16":
            w = mx.array(dense).astype(mx.bfloat16)
        else:
            w = mx.array(dense)
        return graph.DeviceLinear(w, bias=b, sources=tuple(names))

    def _device_linear(self, lin: Linear) -> graph.DeviceLinear:
        """A host Linear made resident (_linear), its LoRA parts with it; one whose adapters
        were merged at load as the host's f32 rows (the file's blocks no longer hold it)."""
        if lin.merged:
            for n in lin.sources:
                self.tensor_held[n] = "f32 (LoRA merged at load)"
            b = mx.array(lin.b) if lin.b is not None else None
            return graph.DeviceLinear(mx.array(dequantized(lin.w)), bias=b, sources=lin.sources)
        d = self._linear(list(lin.sources), lin.w, lin.b)
        if lin.lora:
            d.lora = device_lora(lin.lora, lin.shape[0], self.lora_index)
        return d

    def _experts(self, names: list[str], dense: Callable[[], np.ndarray]) -> graph.DeviceExperts:
        """A resident expert stack [E, out, in] from the tensors `names` (several: stacked
        along out, as the host fused them): the file's blocks when they map, else dense in
        the file's float type, else the host's f32 (`dense()`: made only then, the host's
        stack may be in blocks)."""
        q = self._quantized(names)
        if q is not None:
            return graph.DeviceExperts(*self._resident(q), q.bits, q.mode)
        kind = self._dense_kind(names)
        w = np.ascontiguousarray(dense())
        if kind in ("F16", "BF16") and mx.default_device() != mx.gpu:
            # MLX's CPU gather_mm multiplies f32 only (0.32: "Currently only supports
            # float32"); the CPU device is the Linux correctness path, so hold f32 there.
            for n in names:
                self.tensor_held[n] = "f32 (MLX's CPU gather_mm is f32 only)"
            return graph.DeviceExperts(mx.array(w))
        if kind == "F16":
            return graph.DeviceExperts(mx.array(w.astype(np.float16)))
        if kind == "BF16":
            return graph.DeviceExperts(mx.array(w).astype(mx.bfloat16))
        return graph.DeviceExperts(mx.array(w))

    def _moe(self, p: str, e: MoeWeights) -> graph.DeviceMoe:
        ff = e.gate_up_exps.shape[1] // 2  # gate rows, then up rows

        def gate_up_rows(r0: int, r1: int) -> Callable[[], np.ndarray]:
            return lambda: dequantized(e.gate_up_exps)[:, r0:r1]

        names = self._source_names()
        if p + "ffn_gate_up_exps.weight" in names:
            gate_up = [self._experts([p + "ffn_gate_up_exps.weight"], gate_up_rows(0, 2 * ff))]
        else:
            gn, un = p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight"
            src = self.checkpoint.tensors if self.checkpoint is not None else None
            if src is not None and {gn, un} <= names and src.info(gn).dtype != src.info(un).dtype:
                # Different types (a mixed-quant file): two stacks, each held by its own rule.
                gate_up = [
                    self._experts([gn], gate_up_rows(0, ff)),
                    self._experts([un], gate_up_rows(ff, 2 * ff)),
                ]
            else:
                gate_up = [self._experts([gn, un], gate_up_rows(0, 2 * ff))]
        down = self._experts([p + "ffn_down_exps.weight"], lambda: dequantized(e.down_exps))
        inp = self._device_linear(e.inp)
        down_shexp = None if e.down_shexp is None else self._device_linear(e.down_shexp)

        def opt(a: np.ndarray | None) -> mx.array | None:
            return None if a is None else mx.array(a)

        return graph.DeviceMoe(
            inp,
            gate_up,
            down,
            down_shexp,
            opt(e.probs_b),
            gate_up_exps_b=opt(e.gate_up_exps_b),
            down_exps_b=opt(e.down_exps_b),
            router_norm=opt(e.router_norm),
            expert_scale=opt(e.expert_scale),
            pre_norm=opt(e.pre_norm),
            post_norm=opt(e.post_norm),
            dense_post_norm=opt(e.dense_post_norm),
        )

    def upload_layer(self, i: int, lw: LayerWeights) -> LayerWeights:
        """The layer's weights resident (model.weights.map_layer: the host's fields), each
        Linear by the rule of its source tensors, the MoE experts as gathered stacks."""
        return map_layer(
            lw,
            mx.array,
            self._device_linear,
            moe=lambda e: self._moe(f"blk.{i}.", e),
        )

    def upload_head(self, weights) -> tuple[mx.array, graph.DeviceLinear, mx.array | None]:
        out = weights.output
        norm_b = weights.output_norm_b
        return (
            mx.array(weights.output_norm),
            self._device_linear(out),
            mx.array(norm_b) if norm_b is not None else None,
        )
