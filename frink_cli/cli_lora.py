"""LoRA adapters' flags, as llama.cpp spells them (`--lora FILE`, `--lora-scaled FILE
SCALE`, both repeatable; `--lora-init-without-apply`), shared by `frink run`, `bench`,
`chat` and `serve`, and what they become for `frink_cli.load`."""

from __future__ import annotations

import math

import typer

from .errors import FrinkError

LORA = typer.Option(
    None, "--lora", help="a LoRA adapter (GGUF or PEFT directory) at scale 1; repeatable"
)
LORA_SCALED = typer.Option(
    None,
    "--lora-scaled",
    help="a LoRA adapter and its scale (FILE SCALE); repeatable",
)
LORA_INIT = typer.Option(
    False,
    "--lora-init-without-apply",
    help="load the adapters at scale 0 (a server's /lora-adapters sets them later)",
)

# What load() takes: the adapters in flag order, then whether to apply them at load.
LoraArgs = tuple[tuple[tuple[str, float], ...], bool]


def lora_args(
    lora: list[str] | None, scaled: list[tuple[str, float]] | None, init_without_apply: bool
) -> LoraArgs:
    """The flags as load()'s `lora` and `lora_apply` (--lora's first, then --lora-scaled's);
    FrinkError for a scale that is not a finite number."""
    specs = [(path, 1.0) for path in lora or ()]
    for path, scale in scaled or ():
        if not math.isfinite(scale):
            raise FrinkError(f"--lora-scaled {path}: scale {scale} is not a finite number")
        specs.append((path, float(scale)))
    return tuple(specs), not init_without_apply
