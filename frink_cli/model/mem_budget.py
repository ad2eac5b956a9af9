"""A memory budget for a model's weights (--mem-budget GB, load(mem_budget=...)): what stays
resident and what is left in the file, decided from the checkpoint's tensor table before a
byte of weights is read.

Dense and attention weights (everything but the routed expert stacks) stay resident; when
they and the experts do not fit the budget together, the expert stacks stay in the file and
an ExpertCache of budget - dense bytes holds the hot ones (model/expert_cache.py). A budget
that cannot hold the dense part plus one layer's top-k experts is refused by name, as is
streaming what frink cannot stream (an HF directory, experts in a type the host has no
kernels for). `frink info` prints describe(); bench reads the cache's stats.

The budget is a number of GiB, "auto", or None (no flag):
- "auto": what this process may still take (model/available_memory.py: the tightest cgroup
  limit less its working set, or MemAvailable), less a margin for the KV cache and
  activations: a quarter of it, at least AUTO_MARGIN bytes. (What the process holds
  already, the interpreter and NumPy, is out of both figures when they are read.)
- None: the auto budget where the model's weights do not fit it, the host runs it and its
  experts can stay in the file (so a MoE bigger than memory runs rather than being
  killed); else no budget, every weight resident, as before. A dense model too big for
  memory, or a device backend, keeps that old behaviour: nothing is refused by guess.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import FrinkError
from ..formats import Checkpoint
from ..quant import kernels
from ..quant.blocks import KERNEL_TYPES
from .available_memory import available_memory
from .config import ModelConfig
from .expert_cache import ExpertCache

GIB = 1 << 30
AUTO = "auto"
# The least the auto budget leaves for the KV cache and activations.
AUTO_MARGIN = 64 << 20
# --mem-budget's value: GiB, "auto", or None (no flag).
Budget = float | str | None
# A routed expert stack's name (ffn_gate_exps, ffn_up_exps, ffn_gate_up_exps, ffn_down_exps).
_EXPERTS = re.compile(r"blk\.(\d+)\.ffn_(?:gate|up|gate_up|down)_exps\.weight$")
_KERNEL_TYPE_NAMES = frozenset(t.name for t in KERNEL_TYPES)


def budget_bytes(gb: float | None) -> int | None:
    """--mem-budget's GB (GiB, 2^30 bytes) as bytes; FrinkError for a value that is not a
    finite positive number."""
    if gb is None:
        return None
    if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not math.isfinite(gb) or gb <= 0:
        raise FrinkError(f"--mem-budget {gb!r}: needs a positive number of GB, or auto")
    return int(gb * GIB)


def parse_budget(value: Budget) -> Budget:
    """A --mem-budget value checked: None, "auto", or GiB as a float (from a number or its
    text); FrinkError, one line, for anything else."""
    if value is None or value == AUTO:
        return value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise FrinkError(
                f"--mem-budget {value!r}: needs a positive number of GB, or auto"
            ) from None
    budget_bytes(value)
    return value


def auto_budget(root: Path = Path("/")) -> tuple[int, str]:
    """(bytes, where they came from): the memory available less the margin (a quarter, at
    least AUTO_MARGIN)."""
    avail = available_memory(root)
    margin = max(AUTO_MARGIN, avail.bytes // 4)
    source = f"auto: {gb_text(avail.bytes)} GiB available ({avail.source}) less {gb_text(margin)}"
    return max(0, avail.bytes - margin), source


@dataclass(frozen=True)
class BudgetPlan:
    """Bytes the host would hold: the budget, every weight resident (today's layout), the
    dense part, the routed experts, and the least an expert cache must hold (one layer's
    top k: a step's working set)."""

    budget: int
    total: int
    dense: int
    experts: int
    step_min: int
    source: str = "--mem-budget"

    @property
    def streams(self) -> bool:
        """The experts stay in the file (the whole model does not fit the budget)."""
        return self.total > self.budget

    @property
    def cache_capacity(self) -> int:
        return self.budget - self.dense

    def cache(self) -> ExpertCache | None:
        return ExpertCache(self.cache_capacity) if self.streams else None

    def describe(self) -> dict[str, float | bool | str]:
        """What would be resident under the budget, in GiB (frink info)."""
        gib = {
            "budget": self.budget,
            "dense": self.dense,
            "experts": self.experts,
            "expert_cache": self.cache_capacity if self.streams else self.experts,
        }
        sizes: dict[str, float | bool | str] = {k: round(v / GIB, 3) for k, v in gib.items()}
        return sizes | {"streams_experts": self.streams, "budget_source": self.source}


def kept_in_blocks(fmt: str, dtype: str) -> bool:
    """The host holds tensors of this type in the file's blocks (model/reader.py's rule)."""
    return (
        fmt == "gguf"
        and dtype in _KERNEL_TYPE_NAMES
        and kernels.compiled()
        and not os.environ.get("FRINK_F32_WEIGHTS")
    )


def resident_bytes(fmt: str, dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes the host holds a tensor in: the file's blocks, else f32."""
    n = int(np.prod(shape))
    if not kept_in_blocks(fmt, dtype):
        return 4 * n
    elems, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[dtype]]
    return n // elems * nbytes


def plan_budget(
    ckpt: Checkpoint, budget: int, n_expert_used: int, source: str = "--mem-budget"
) -> BudgetPlan:
    """The plan for a budget of `budget` bytes; FrinkError for a budget below the dense part
    plus one layer's top-k experts, or experts frink cannot leave in this file."""
    dense = experts = 0
    per_layer: dict[int, int] = {}
    expert_types: set[str] = set()
    for name in ckpt.tensors.names():
        info = ckpt.tensors.info(name)
        size = resident_bytes(ckpt.format, info.dtype, info.shape)
        m = _EXPERTS.search(name)
        if m is None:
            dense += size
            continue
        experts += size
        layer = int(m.group(1))
        per_layer[layer] = per_layer.get(layer, 0) + size // info.shape[0] * n_expert_used
        expert_types.add(info.dtype)
    step_min = max(per_layer.values(), default=0)
    plan = BudgetPlan(budget, dense + experts, dense, experts, step_min, source)
    if plan.streams:
        _check_streamable(ckpt, plan, expert_types)
    return plan


def _check_streamable(ckpt: Checkpoint, plan: BudgetPlan, expert_types: set[str]) -> None:
    need = f"{gb_text(plan.total)} GB"
    if not plan.experts:
        raise FrinkError(
            f"--mem-budget {gb_text(plan.budget)} GB: the model's weights need {need} and it "
            "has no routed experts to leave in the file"
        )
    least = plan.dense + plan.step_min
    if plan.budget < least:
        raise FrinkError(
            f"--mem-budget {gb_text(plan.budget)} GB is below what the model needs resident: "
            f"{gb_text(plan.dense)} GB of dense weights plus {gb_text(plan.step_min)} GB "
            f"for one layer's chosen experts (at least {gb_text(least)} GB)"
        )
    if ckpt.format != "gguf" or not hasattr(ckpt.tensors, "span"):
        raise FrinkError(
            f"--mem-budget: experts stay in the file only for GGUF files (the model needs {need})"
        )
    odd = sorted(t for t in expert_types if not kept_in_blocks("gguf", t))
    if odd:
        raise FrinkError(
            f"--mem-budget: experts of type {', '.join(odd)} have no host kernels, so they "
            f"cannot stay in the file (the model needs {need})"
        )


def gb_text(n_bytes: int) -> str:
    """Bytes as GiB, three decimals."""
    return f"{n_bytes / GIB:.3f}"


def budget_plan(ckpt: Checkpoint, cfg: ModelConfig, gb: Budget, backend: str) -> BudgetPlan | None:
    """load()'s plan for `gb` (GiB, "auto", or None: see the module's docstring; None
    where every weight stays resident). A device backend keeps today's behaviour where the
    model fits the budget and is refused by name where it does not (its experts live on
    the device whole); "auto" then runs the host."""
    gb = parse_budget(gb)
    moe = getattr(cfg.ext, "moe", None)
    k = moe.n_expert_used if moe is not None else 0
    if gb is None:
        return _default_plan(ckpt, k, backend)
    if gb == AUTO:
        budget, source = auto_budget()
    else:
        budget, source = budget_bytes(float(gb)) or 0, "--mem-budget"
    plan = plan_budget(ckpt, budget, k, source)
    if plan.streams and backend not in ("numpy", "auto"):
        raise FrinkError(
            f"{backend}: --mem-budget {gb_text(plan.budget)} GB is smaller than the model's "
            f"{gb_text(plan.total)} GB, and this backend holds every expert (numpy leaves "
            "them in the file)"
        )
    return plan


def _default_plan(ckpt: Checkpoint, n_expert_used: int, backend: str) -> BudgetPlan | None:
    """No --mem-budget: the auto budget's plan where the host would stream the experts of
    a model bigger than it, else None (every weight resident)."""
    if backend not in ("numpy", "auto") or not n_expert_used:
        return None
    try:
        budget, source = auto_budget()
        plan = plan_budget(ckpt, budget, n_expert_used, f"{source}; the model does not fit")
    except FrinkError:
        return None  # no reading of memory, or nothing to stream: load as before
    return plan if plan.streams else None
