"""LoRA adapters' flags, as llama.cpp spells them (`--lora FILE`, `--lora-scaled FILE
SCALE`, both repeatable; `--lora-init-without-apply`), and `--lora-merge` (llama.cpp's
export-lora, at load), shared by `frink run`, `bench`, `chat` and `serve` as one flag
group (cli_groups: the commands take `adapters: LoraArgs`), and what they become for
`frink_cli.load`."""

from __future__ import annotations

import math
from typing import NamedTuple

import typer

from .cli_groups import flag_group
from .errors import FrinkError

# --lora-scaled takes two words, which typer's options cannot; join_scaled() makes them
# one value, FILE and SCALE joined by this (a character no argument can hold).
_JOIN = "\0"


class LoraArgs(NamedTuple):
    """What load() takes: the adapters in flag order (`lora`), whether to apply them at
    load (`lora_apply`), whether to merge them into the weights (`lora_merge`)."""

    adapters: tuple[tuple[str, float], ...] = ()
    apply: bool = True
    merge: bool = False

    def load_options(self) -> dict[str, object]:
        return dict(lora=self.adapters, lora_apply=self.apply, lora_merge=self.merge)


NO_LORA = LoraArgs()  # a command run without the flags


def join_scaled(argv: list[str]) -> list[str]:
    """argv with each `--lora-scaled FILE SCALE` as `--lora-scaled FILE<NUL>SCALE`, the one
    value typer passes on (a `--lora-scaled` without two words after it is left as it is,
    for lora_args to refuse)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--lora-scaled" and i + 2 < len(argv) and argv[i + 1] != "--":
            out += [argv[i], argv[i + 1] + _JOIN + argv[i + 2]]
            i += 3
            continue
        out.append(argv[i])
        i += 1
    return out


def lora_args(
    lora: list[str] | None = typer.Option(
        None,
        "--lora",
        metavar="FILE",
        help="a LoRA adapter (GGUF or PEFT directory) at scale 1; repeatable",
    ),
    lora_scaled: list[str] | None = typer.Option(
        None,
        "--lora-scaled",
        metavar="FILE SCALE",
        help="a LoRA adapter and its scale; repeatable",
    ),
    lora_init_without_apply: bool = typer.Option(
        False,
        "--lora-init-without-apply",
        help="load the adapters at scale 0 (a server's /lora-adapters sets them later)",
    ),
    lora_merge: bool = typer.Option(
        False,
        "--lora-merge",
        help="add the adapters into f32 copies of the weights they adapt at load: faster, "
        "the scales then fixed (quantized tensors an adapter touches are dequantized)",
    ),
) -> LoraArgs:
    """The flags as load()'s `lora` and `lora_apply` (--lora's first, then --lora-scaled's,
    each a join_scaled value); FrinkError for a missing or non-finite scale."""
    specs = [(path, 1.0) for path in lora or ()]
    for value in lora_scaled or ():
        path, _, text = value.partition(_JOIN)
        try:
            scale = float(text)
        except ValueError:
            scale = math.nan
        if not math.isfinite(scale):
            raise FrinkError(f"--lora-scaled {path}: needs FILE SCALE, a finite number")
        specs.append((path, scale))
    return LoraArgs(tuple(specs), not lora_init_without_apply, lora_merge)


lora_flags = flag_group("adapters", lora_args)
