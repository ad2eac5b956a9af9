"""The `frink` command. Thin: parse flags, call the library, print.

Stdout carries the answer alone (generated text, or one JSON object with --json);
progress, logs and stats go to stderr. A bad input (FrinkError, or a flag click rejects)
ends with one line on stderr and a non-zero exit; -v adds the traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .backends import BACKEND_NAMES, check_backend_name
from .cache.kv_types import (
    CACHE_TYPES,
    DEFAULT_CACHE_TYPE,
    ENV_K,
    ENV_V,
    OPTION_K,
    OPTION_V,
    check_cache_type,
)
from .cli_checks import (
    check_range,
    check_ranges,
    check_utf8,
    constraint_args,
    read_prompt,
)
from .cli_embed import POOLING_OPTION, embed
from .cli_exit import err, run_app, verbose_flag
from .cli_lora import NO_LORA, LoraArgs, join_scaled, lora_flags
from .cli_memory import NO_PLACEMENT, Budget, Placement, mem_budget_flags, placement_flags
from .cli_pipeline import following, launched, load_or_follow, rank_submissions
from .cli_run import generate_and_print
from .cli_sampling import sampling_flags
from .cli_server import ServerOptions, server_flags
from .cli_spec import SpecFlags, speculation_flags
from .errors import FrinkError, printable

# The api (numpy, the model code) is imported lazily, per command: `frink --help` stays quick.

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="frink: run GGUF and Hugging Face models locally.",
)


def _load(
    model_arg: str | None,
    backend: str,
    quiet: bool = False,
    check_tensors: bool = False,
    cache_types: tuple[str | None, str | None] = (None, None),
    lora: LoraArgs = NO_LORA,
    placement: Placement = NO_PLACEMENT,
    stage: bool = True,
):
    """The model, loaded with a progress bar on a terminal; cache_types: -ctk and -ctv
    (None: the default, load()'s);
    lora: the LoRA flags (cli_lora.lora_args). Under mlx.launch (stage: unless this is a
    draft model), this rank's part of it: a following rank ends the command once rank 0 is
    done (cli_pipeline.py)."""
    from .api import load
    from .pull import resolve_model_arg

    path = resolve_model_arg(model_arg)
    ctk, ctv = cache_types
    opts: dict[str, Any] = dict(check_tensors=check_tensors, cache_type_k=ctk, cache_type_v=ctv)
    opts.update(lora.load_options(), mem_budget=placement.mem_budget)
    if stage and launched():
        return load_or_follow(path, backend, placement.layer_split, **opts)
    # No bar when stderr is a pipe or file: there it is only noise (rich leaves a blank line).
    if quiet or not err.is_terminal:
        return load(path, backend=backend, **opts)
    with Progress(
        TextColumn("[dim]loading {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task(Path(path).name, total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return load(path, backend=backend, progress=report, **opts)


def _backend_option(default: str, help: str, choices: tuple[str, ...] = BACKEND_NAMES) -> Any:
    """--backend for every command: checked as it is parsed, by the library's one check, so
    a bad name is refused before anything loads."""

    def check(value: str) -> str:
        try:
            return check_backend_name(value, choices)
        except FrinkError as e:
            raise typer.BadParameter(str(e)) from None

    return typer.Option(default, "--backend", help=help, callback=check)


def _cache_type_option(option: str) -> Any:
    """-ctk/--cache-type-k or -ctv/--cache-type-v, checked as it is parsed."""

    def check(value: str | None) -> str | None:
        try:
            return None if value is None else check_cache_type(value, option)
        except FrinkError as e:
            raise typer.BadParameter(str(e)) from None

    short, long = option.split("/")
    which = "K" if long.endswith("k") else "V"
    env = ENV_K if which == "K" else ENV_V
    return typer.Option(
        None,
        short,
        long,
        help=f"KV cache type for {which}: {'|'.join(CACHE_TYPES)} (stored rows rounded as "
        f"llama.cpp rounds them; default ${env}, else {DEFAULT_CACHE_TYPE}, f32 on cuda)",
        callback=check,
        show_default=False,
    )


# The options several commands share, one definition each.
_MODEL = typer.Argument(None, help="GGUF file, HF directory or model name")
_BACKEND = _backend_option("auto", "auto|numpy|metal|cuda")
_CTX_SIZE = typer.Option(
    0, "-c", "--ctx-size", help="context size (0: the model's, capped at 4096)"
)
_CACHE_TYPE_K = _cache_type_option(OPTION_K)
_CACHE_TYPE_V = _cache_type_option(OPTION_V)


# `frink run`'s constraint flags and `frink serve`'s longer ones.
_JSON_SCHEMA = typer.Option(
    None,
    "-j",
    "--json-schema",
    help="constrain the output to JSON valid under this schema (JSON text or a file); "
    "'{}' for any JSON",
)
_GRAMMAR = typer.Option(
    None, "--grammar", help="constrain the output to a grammar (llama.cpp GBNF, or Lark)"
)
_GRAMMAR_FILE = typer.Option(None, "--grammar-file", help="read --grammar from a file")
_JSON_SCHEMA_FILE = typer.Option(
    None, "-jf", "--json-schema-file", help="read --json-schema from a file"
)
_REGEX = typer.Option(None, "--regex", help="constrain the output to match this regular expression")


def _speculate(m: Any, flags: SpecFlags | None, backend: str, quiet: bool = False) -> None:
    """Set m to decode speculatively as the flags say (None: plainly), loading the draft
    model where one is named."""
    if flags is not None:
        model = flags.draft_model
        draft = _load(model, backend, quiet=quiet, stage=False) if model else None
        m.speculate(flags.params, draft)


def _n_ctx(m: Any, ctx_size: int) -> int:
    """The context -c/--ctx-size asks for: 0 is the model's own, capped at 4096."""
    return ctx_size or min(m.config.n_ctx_train, 4096)


def _model_flags(command: Any) -> Any:
    """The flag groups of the commands that load a model to generate with it (run, bench,
    serve): speculation, where the weights go, LoRA adapters, -v."""
    for group in (verbose_flag, lora_flags, placement_flags, speculation_flags):
        command = group(command)
    return command


@app.command()
@_model_flags
@sampling_flags
def run(
    model: str | None = typer.Argument(
        None,
        help="GGUF file, HF directory, or a model name from `frink models` (default: smollm2-135m)",
    ),
    prompt: str | None = typer.Option(None, "-p", "--prompt", help="prompt text; '-' reads stdin"),
    file: Path | None = typer.Option(None, "-f", "--file", help="read the prompt from a file"),
    max_tokens: int = typer.Option(256, "-n", "--max-tokens", help="tokens to generate at most"),
    ctx_size: int = _CTX_SIZE,
    cache_type_k: str | None = _CACHE_TYPE_K,
    cache_type_v: str | None = _CACHE_TYPE_V,
    sampling: dict[str, Any] | None = None,
    repeat_last_n: int = typer.Option(64, "--repeat-last-n"),
    system: str | None = typer.Option(
        None, "--system", help="system message for the chat template"
    ),
    raw: bool = typer.Option(False, "--raw", help="no chat template: the prompt goes in as-is"),
    grammar: str | None = _GRAMMAR,
    grammar_file: Path | None = _GRAMMAR_FILE,
    json_schema: str | None = _JSON_SCHEMA,
    json_schema_file: Path | None = _JSON_SCHEMA_FILE,
    regex: str | None = _REGEX,
    backend: str = _BACKEND,
    as_json: bool = typer.Option(
        False, "--json", help="print one JSON object instead of streaming text"
    ),
    check_tensors: bool = typer.Option(
        False, "--check-tensors", help="scan every weight for NaN/Inf at load"
    ),
    speculation: SpecFlags | None = None,
    adapters: LoraArgs = NO_LORA,
    placement: Placement = NO_PLACEMENT,
    verbose: bool = False,
) -> None:
    """Generate text from a prompt."""
    check_ranges(
        ("-n/--max-tokens", max_tokens, 0, None),
        ("-c/--ctx-size", ctx_size, 0, None),
        ("--repeat-last-n", repeat_last_n, -1, None),
    )
    # A following rank needs no prompt: its stdin (-p -) is rank 0's to read.
    text_in = "" if following() else read_prompt(prompt, file, ctx_size)
    if system is not None:
        check_utf8(system, "--system")
    constrain = constraint_args(grammar, grammar_file, json_schema, json_schema_file, regex)

    m = _load(
        model,
        backend,
        quiet=as_json and not verbose,
        check_tensors=check_tensors,
        cache_types=(cache_type_k, cache_type_v),
        lora=adapters,
        placement=placement,
    )
    # Compiled before the prompt runs: a grammar that does not compile stops here.
    constraint = m.constraint(**constrain)
    _speculate(m, speculation, backend, quiet=as_json and not verbose)
    if speculation is not None and constraint is not None:
        err.print("note: speculative decoding is off under a constraint", style="dim")
    n_ctx = _n_ctx(m, ctx_size)
    notes: list[str] = []
    # The ids first (not a string into generate) so the template's notes show before the text.
    ids = m.prompt_ids(text_in, raw=raw, system=system, notes=notes, n_ctx=n_ctx)
    for note in notes:
        err.print(f"note: {printable(note)}", style="dim", markup=False)
    assert sampling is not None  # the flag group's
    sampling = dict(sampling, repeat_last_n=repeat_last_n)
    generate_and_print(m, ids, raw, max_tokens, ctx_size, sampling, constraint, as_json, verbose)


@app.command()
@mem_budget_flags
@verbose_flag
def info(
    model: str | None = _MODEL,
    as_json: bool = typer.Option(False, "--json"),
    backend: str = _backend_option(
        "numpy",
        "say which layers this backend takes and how it holds each tensor type (numpy|metal|cuda)",
    ),
    memory: Budget = None,
    verbose: bool = False,
) -> None:
    """Describe a model: architecture, sizes, tensor types, layers, tokenizer."""
    from .pull import resolve_model_arg
    from .report import describe, print_info

    path = resolve_model_arg(model)
    data = describe(path, backend, memory)
    if as_json:
        sys.stdout.write(json.dumps(data) + "\n")
        return
    print_info(data, sys.stdout.write)


@app.command()
@_model_flags
def bench(
    model: str | None = _MODEL,
    n_prompt: int = typer.Option(512, "-p", "--n-prompt", help="prompt test size (0: none)"),
    n_gen: int = typer.Option(128, "-n", "--n-gen", help="generation test size (0: none)"),
    n_depth: int = typer.Option(
        0, "-d", "--n-depth", help="tokens already in the context for each test (untimed)"
    ),
    cache_type_k: str | None = _CACHE_TYPE_K,
    cache_type_v: str | None = _CACHE_TYPE_V,
    repetitions: int = typer.Option(3, "-r", "--repetitions", help="timed repetitions per test"),
    threads: int = typer.Option(
        0, "-t", "--threads", help="threads for llama.cpp and frink (0: all cores)"
    ),
    backend: str = _BACKEND,
    compare: str | None = typer.Option(
        None, "--compare", help="also run llama.cpp on the same GGUF"
    ),
    submissions: bool = typer.Option(
        False, "--submissions", help="add device submissions and refusals"
    ),
    constrained: bool = typer.Option(
        False,
        "--constrained",
        help="add generation sampled free and under a JSON schema (the mask's cost)",
    ),
    speculation: SpecFlags | None = None,
    adapters: LoraArgs = NO_LORA,
    placement: Placement = NO_PLACEMENT,
    as_json: bool = typer.Option(False, "--json", help="a JSON list of rows"),
    as_csv: bool = typer.Option(False, "--csv", help="CSV rows"),
    as_md: bool = typer.Option(False, "--md", help="a markdown table (the default)"),
    verbose: bool = False,
) -> None:
    """Measure prompt and generation speed, llama-bench style; with --spec / -md, greedy
    generation from a code-edit prompt, plain against speculative."""
    from . import bench as B

    if as_json + as_csv + as_md > 1:
        raise FrinkError("choose one output format: --json, --csv or --md")
    check_range("-t/--threads", threads, 0)
    m = _load(
        model,
        backend,
        cache_types=(cache_type_k, cache_type_v),
        lora=adapters,
        placement=placement,
    )
    _speculate(m, speculation, backend)
    rows = B.run_bench(
        m,
        n_prompt=n_prompt,
        n_gen=n_gen,
        n_depth=n_depth,
        repetitions=repetitions,
        n_threads=threads or None,
        compare=compare,
        submissions=submissions,
        constrained=constrained,
        progress=lambda msg: err.print(f"[dim]{msg}[/dim]", markup=True),
    )
    if as_json:
        sys.stdout.write(B.format_json(rows, submissions))
    elif as_csv:
        sys.stdout.write(B.format_csv(rows, submissions))
    else:
        sys.stdout.write(B.format_md(rows, submissions))
    if submissions and launched():
        sys.stdout.write(rank_submissions(m))  # per rank, over the whole bench


@app.command()
@mem_budget_flags
@lora_flags
@sampling_flags
@verbose_flag
def chat(
    model: str | None = _MODEL,
    ctx_size: int = _CTX_SIZE,
    cache_type_k: str | None = _CACHE_TYPE_K,
    cache_type_v: str | None = _CACHE_TYPE_V,
    max_tokens: int = typer.Option(1024, "-n", "--max-tokens", help="tokens per answer at most"),
    system: str | None = typer.Option(None, "--system", help="system message"),
    sampling: dict[str, Any] | None = None,
    backend: str = _BACKEND,
    adapters: LoraArgs = NO_LORA,
    memory: Budget = None,
    verbose: bool = False,
) -> None:
    """Chat with the model in the terminal (/reset, /system TEXT, /exit; Ctrl-C stops an
    answer)."""
    from .repl import chat_loop
    from .sampling import SamplingParams

    check_range("-c/--ctx-size", ctx_size, 0)
    check_range("-n/--max-tokens", max_tokens, 1)
    if system is not None:
        check_utf8(system, "--system")
    params = SamplingParams(**(sampling or {}))
    m = _load(
        model,
        backend,
        cache_types=(cache_type_k, cache_type_v),
        lora=adapters,
        placement=Placement(memory),
    )
    chat_loop(
        m,
        n_ctx=_n_ctx(m, ctx_size),
        params=params,
        max_tokens=max_tokens,
        system=system,
        out=sys.stdout,
        note=lambda line: err.print(printable(line), style="dim", markup=False),
    )


@app.command()
@_model_flags
@server_flags
def serve(
    model: str | None = _MODEL,
    parallel: int = typer.Option(4, "-np", "--parallel", help="sequences decoded together (slots)"),
    ctx_size: int = typer.Option(
        0, "-c", "--ctx-size", help="context per sequence (0: the model's, capped at 4096)"
    ),
    cache_type_k: str | None = _CACHE_TYPE_K,
    cache_type_v: str | None = _CACHE_TYPE_V,
    backend: str = _BACKEND,
    pooling: str | None = POOLING_OPTION,
    server: ServerOptions | None = None,
    speculation: SpecFlags | None = None,
    adapters: LoraArgs = NO_LORA,
    placement: Placement = NO_PLACEMENT,
    verbose: bool = False,
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API, with continuous batching."""
    from .embedding import check_pooling, with_pooling
    from .serve.server import serve as run_server

    assert server is not None  # the flag group's value
    check_ranges(("-np/--parallel", parallel, 1, 256), ("-c/--ctx-size", ctx_size, 0, None))
    check_pooling(pooling)
    m = _load(
        model,
        backend,
        cache_types=(cache_type_k, cache_type_v),
        lora=adapters,
        placement=placement,
    )
    m.embed_plan = with_pooling(m.embed_plan, pooling)
    _speculate(m, speculation, backend)
    run_server(
        m,
        n_parallel=parallel,
        n_ctx=_n_ctx(m, ctx_size),
        announce=lambda line: err.print(f"frink: {printable(line)}", markup=False),
        **server.kwargs(),
    )
    err.print("frink: server stopped", markup=False)


@app.command()
@verbose_flag
def parity(
    model: str | None = _MODEL,
    backend: str = _backend_option("metal", "the backend to check: metal|cuda", ("metal", "cuda")),
    prompt: str | None = typer.Option(
        None, "-p", "--prompt", help="prompt text (BOS per the file)"
    ),
    n_tokens: int = typer.Option(
        0, "--tokens", help="N seeded synthetic token ids instead of a prompt"
    ),
    steps: int = typer.Option(32, "--steps", help="greedy decode steps compared after the prefill"),
    cache_type_k: str | None = _CACHE_TYPE_K,
    cache_type_v: str | None = _CACHE_TYPE_V,
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = False,
) -> None:
    """Check that an accelerated backend computes the same model as the host body."""
    from .parity import check_parity, print_report

    check_range("--steps", steps, 0)
    check_range("--tokens", n_tokens, 0)
    if prompt is not None and n_tokens:
        raise FrinkError("give --prompt or --tokens, not both")
    m = _load(model, backend, quiet=as_json, cache_types=(cache_type_k, cache_type_v))
    if n_tokens or prompt is None:
        rng = np.random.default_rng(0)
        ids = rng.integers(0, m.config.n_vocab, size=n_tokens or 16).tolist()
    else:
        ids = m.tokenize(prompt)
    r = check_parity(m, ids, steps)
    if as_json:
        sys.stdout.write(json.dumps(r.as_dict()) + "\n")
    else:
        print_report(r, sys.stdout.write)
    if not r.ok:  # WRONG, FAILED or NOT RUN: a check that did not pass
        raise typer.Exit(1)


@app.command()
def pull(
    name: str | None = typer.Argument(None, help="model name (default: smollm2-135m)"),
) -> None:
    """Fetch a known model into the model store and print its path."""
    from .pull import DEFAULT_MODEL, ensure_model

    sys.stdout.write(f"{ensure_model(name or DEFAULT_MODEL)}\n")


@app.command()
def models() -> None:
    """List the models frink knows how to fetch."""
    from .pull import list_models

    for name, desc, path in list_models():
        sys.stdout.write(f"{name:<16} {desc}  [{path if path else 'not fetched'}]\n")


app.command()(embed)


def main() -> None:
    """The `frink` console script: the app, with main_exit's one-line error path."""
    sys.argv[1:] = join_scaled(sys.argv[1:])
    run_app(app)


if __name__ == "__main__":
    main()
