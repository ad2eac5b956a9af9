"""The sampling flags `frink run` and `frink chat` share (llama.cpp's spellings and
defaults), one flag group (cli_groups): the commands take `sampling: dict` with
SamplingParams' fields, already range-checked."""

from __future__ import annotations

from typing import Any

import typer

from .cli_checks import check_ranges
from .cli_groups import flag_group


def sampling_args(
    temp: float = typer.Option(0.8, "--temp", help="temperature; 0 is greedy"),
    top_k: int = typer.Option(40, "--top-k"),
    top_p: float = typer.Option(0.95, "--top-p"),
    min_p: float = typer.Option(0.05, "--min-p"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty"),
    seed: int = typer.Option(-1, "-s", "--seed", help="RNG seed (-1: random)"),
) -> dict[str, Any]:
    """The flags as SamplingParams' fields (seed < 0: a fresh random seed); FrinkError
    naming the first flag out of its range."""
    check_ranges(
        ("--temp", temp, 0, None),
        ("--top-k", top_k, 0, None),
        ("--top-p", top_p, 0, 1),
        ("--min-p", min_p, 0, 1),
        ("--repeat-penalty", repeat_penalty, 0, None),
    )
    return dict(
        temperature=temp,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repeat_penalty=repeat_penalty,
        seed=None if seed < 0 else seed,
    )


sampling_flags = flag_group("sampling", sampling_args)
