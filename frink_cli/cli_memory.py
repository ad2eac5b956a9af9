"""--mem-budget GB, shared by `frink run`, `bench`, `chat`, `serve` and `info` as one flag
group (cli_groups: the commands take `memory: float | None`), checked once here and
passed to `frink_cli.load(mem_budget=...)` (model/mem_budget.py says what it does)."""

from __future__ import annotations

import typer

from .cli_groups import flag_group
from .model.mem_budget import budget_bytes


def mem_budget_arg(
    mem_budget: float | None = typer.Option(
        None,
        "--mem-budget",
        metavar="GB",
        help="GiB the weights may hold; a MoE model bigger than that leaves its experts in "
        "the file and caches the hot ones (numpy backend)",
    ),
) -> float | None:
    """The budget in GiB (None: none); FrinkError for a value that is not positive."""
    budget_bytes(mem_budget)
    return mem_budget


mem_budget_flags = flag_group("memory", mem_budget_arg)
