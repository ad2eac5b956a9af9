"""Where the weights go: --mem-budget GB (model/mem_budget.py says what it does) and, under
mlx.launch, --layer-split (cli_pipeline). `frink chat` and `info` take the budget alone as
`memory: Budget` (mem_budget_flags); `frink run`, `bench` and `serve` take both as
`placement: Placement` (placement_flags). Checked once here, for `_load` and
`frink_cli.load(mem_budget=...)`."""

from __future__ import annotations

from typing import NamedTuple

import typer

from .cli_groups import flag_group
from .cli_pipeline import LAYER_SPLIT
from .model.mem_budget import Budget, parse_budget

MEM_BUDGET = typer.Option(
    None,
    "--mem-budget",
    metavar="GB|auto",
    help="GiB the weights may hold, or auto (the memory available, cgroup or MemAvailable, "
    "less a margin); a MoE model bigger than that leaves its experts in the file and caches "
    "the hot ones (numpy backend). Default: auto where a MoE model does not fit, else none",
)


class Placement(NamedTuple):
    """The budget (GiB, "auto", None: the default) and the pipeline's --layer-split (None:
    by memory)."""

    mem_budget: Budget = None
    layer_split: str | None = None


NO_PLACEMENT = Placement()


def mem_budget_arg(mem_budget: str | None = MEM_BUDGET) -> Budget:
    """The budget: GiB, "auto", or None; FrinkError for anything else."""
    return parse_budget(mem_budget)


def placement_args(
    mem_budget: str | None = MEM_BUDGET, layer_split: str | None = LAYER_SPLIT
) -> Placement:
    """The flags as a Placement; FrinkError for a budget that is not positive."""
    return Placement(mem_budget_arg(mem_budget), layer_split)


mem_budget_flags = flag_group("memory", mem_budget_arg)
placement_flags = flag_group("placement", placement_args)
