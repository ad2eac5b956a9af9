"""The `frink` command. Thin: parse flags, call the library, print.

Stdout carries the answer alone (generated text, or one JSON object with --json);
progress, logs and stats go to stderr. A bad input (FrinkError, or a flag click rejects)
ends with one line on stderr and a non-zero exit; -v adds the traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from . import interrupt
from .backends import BACKEND_NAMES, check_backend_name
from .channels import FINAL, ChannelSplit, is_harmony
from .errors import FrinkError, printable, terminal_text

# The api (numpy, the model code) is imported lazily, per command: `frink --help` stays quick.

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="frink: run GGUF and Hugging Face models locally.",
)
# soft_wrap: an error or stats line stays one line at any terminal width (rich would
# otherwise wrap at 80 columns when stderr is a pipe, splitting "frink: error: ...").
err = Console(stderr=True, highlight=False, soft_wrap=True)
_verbose = False

# Typer >= 0.22 vendors click as typer._click, whose exceptions are not click's own; catch
# both so a bad flag is one line under either. The two copies' ClickExceptions are
# unrelated classes of one shape (show, exit_code, format_message): no common type but Any.
_USAGE_ERRORS: tuple[type[Any], ...] = (click.exceptions.ClickException,)
_ABORTS: tuple[type[BaseException], ...] = (click.exceptions.Abort, typer.Abort)
_HELP_ERRORS: tuple[type[Any], ...] = tuple(
    c for c in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if c is not None
)
try:
    from typer._click import exceptions as _typer_click

    _USAGE_ERRORS += (_typer_click.ClickException,)
    _HELP_ERRORS += (_typer_click.NoArgsIsHelpError,)
except (ImportError, AttributeError):
    pass


def _peak_memory_mib() -> float:
    from .bench import peak_memory_mib  # one definition (bench.py says why it is not ru_maxrss)

    return peak_memory_mib()


def _load(model_arg: str | None, backend: str, quiet: bool = False, check_tensors: bool = False):
    from .api import load
    from .pull import resolve_model_arg

    path = resolve_model_arg(model_arg)
    # No bar when stderr is a pipe or file: there it is only noise (rich leaves a blank line).
    if quiet or not err.is_terminal:
        return load(path, backend=backend, check_tensors=check_tensors)
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

        return load(path, backend=backend, progress=report, check_tensors=check_tensors)


def _backend_option(default: str, help: str, choices: tuple[str, ...] = BACKEND_NAMES) -> Any:
    """--backend for every command: checked as it is parsed, by the library's one check, so
    a bad name is refused before anything loads."""

    def check(value: str) -> str:
        try:
            return check_backend_name(value, choices)
        except FrinkError as e:
            raise typer.BadParameter(str(e)) from None

    return typer.Option(default, "--backend", help=help, callback=check)


# Bytes of prompt read per token of context at most: no vocabulary has tokens near this
# long, so a longer input cannot fit, and reading stops there (`-f /dev/zero` ends).
_PROMPT_BYTES_PER_TOKEN = 1024


def _read_prompt(prompt: str | None, file: Path | None, n_ctx: int = 0) -> str:
    """The prompt text; from a file or stdin, read only as far as a context of n_ctx tokens
    (0: the default 4096) could hold."""
    if prompt is not None and file is not None:
        raise FrinkError("give the prompt with -p or -f, not both")
    limit = (n_ctx or 4096) * _PROMPT_BYTES_PER_TOKEN
    if file is not None:
        try:
            from .formats.jsonfile import open_regular

            with open_regular(file) if file.is_file() else open(file, "rb") as f:
                raw = f.read(limit + 1)
        except OSError as e:
            raise FrinkError(f"cannot read prompt file {file}: {e.strerror}") from None
        source = f"prompt file {file}"
    elif prompt == "-":
        if sys.stdin is None:
            raise FrinkError("cannot read the prompt from stdin: stdin is closed")
        try:
            raw = sys.stdin.buffer.read(limit + 1)
        except (OSError, ValueError) as e:
            raise FrinkError(
                f"cannot read the prompt from stdin: {getattr(e, 'strerror', e)}"
            ) from None
        source = "the prompt on stdin"
    elif prompt is None:
        raise FrinkError("no prompt: pass -p TEXT, -p - (stdin) or -f FILE")
    else:
        return _check_utf8(prompt, "-p/--prompt")
    if len(raw) > limit:
        raise FrinkError(
            f"{source} is more than {limit} bytes, more than a context of {n_ctx or 4096} "
            "tokens can hold"
        )
    try:
        # Bytes, decoded strictly: the text stream's surrogateescape (C/POSIX locales)
        # would hand the tokenizer lone surrogates, which it cannot encode.
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FrinkError(f"{source} is not UTF-8 text") from None
    # The newline translation text-mode reads apply.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _check_utf8(text: str, flag: str) -> str:
    """Non-UTF-8 bytes in argv arrive as lone surrogates; refuse them by name."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise FrinkError(f"invalid value for {flag}: not UTF-8 text") from None
    return text


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _check_range(name: str, value: float, lo: float | None = None, hi: float | None = None) -> None:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise FrinkError(f"invalid value for {name}: {value} (must be {bounds})")


def _read_grammar_file(path: Path, flag: str) -> str:
    """A grammar or schema file's text, read no further than a grammar may be long."""
    from .constraint import GRAMMAR_MAX_BYTES

    try:
        with open(path, "rb") as f:
            data = f.read(GRAMMAR_MAX_BYTES + 1)
    except OSError as e:
        raise FrinkError(f"cannot read {flag} {path}: {e.strerror or e}") from None
    if len(data) > GRAMMAR_MAX_BYTES:
        raise FrinkError(f"{flag} {path} is larger than {GRAMMAR_MAX_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FrinkError(f"{flag} {path} is not UTF-8 text") from None


def _constraint_args(
    grammar: str | None,
    grammar_file: Path | None,
    json_schema: str | None,
    json_schema_file: Path | None,
    regex: str | None,
) -> dict[str, Any]:
    """Model.constraint's keywords from run's flags (at most one of them given)."""
    given = [
        flag
        for flag, v in (
            ("--grammar", grammar),
            ("--grammar-file", grammar_file),
            ("-j/--json-schema", json_schema),
            ("--json-schema-file", json_schema_file),
            ("--regex", regex),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise FrinkError(f"give one constraint, not {' and '.join(given)}")
    if grammar_file is not None:
        grammar = _read_grammar_file(grammar_file, "--grammar-file")
    if json_schema is not None and not json_schema.lstrip().startswith(("{", "[", "t", "f")):
        # llama.cpp's -j takes the schema itself; a path is taken too (FILE_OR_JSON).
        json_schema_file = Path(json_schema)
    if json_schema_file is not None:
        json_schema = _read_grammar_file(json_schema_file, "--json-schema-file")
    if grammar is not None:
        _check_utf8(grammar, "--grammar")
    if regex is not None:
        _check_utf8(regex, "--regex")
    return {"grammar": grammar, "json_schema": json_schema, "regex": regex}


def _generated(
    m: Any,
    ids: list[int],
    raw: bool,
    max_tokens: int,
    n_ctx: int | None,
    stats: Any,
    sampling: dict[str, Any],
    constraint: Any = None,
) -> Iterator[tuple[str, str]]:
    """(channel, text) as generated: every piece "final", except from a harmony model
    (gpt-oss) in chat mode, whose messages are split by channel (channels.ChannelSplit).
    `constraint` (Model.constraint) masks every generated token."""
    tok = m.tokenizer
    if raw or tok is None or not is_harmony(tok):
        stream = tok.stream() if tok is not None else None
        for token in m.generate_ids(
            ids, max_tokens=max_tokens, n_ctx=n_ctx, stats=stats, constraint=constraint, **sampling
        ):
            piece = stream.push(token) if stream is not None else ""
            if piece:
                yield FINAL, piece
        tail = stream.flush() if stream is not None else ""
        if tail:
            yield FINAL, tail
        return
    split = ChannelSplit(tok)
    for token in m.generate_ids(
        ids, max_tokens=max_tokens, n_ctx=n_ctx, stats=stats, constraint=constraint, **sampling
    ):
        yield from split.push(token)
    yield from split.flush()


@app.command()
def run(
    model: str | None = typer.Argument(
        None,
        help="GGUF file, HF directory, or a model name from `frink models` (default: smollm2-135m)",
    ),
    prompt: str | None = typer.Option(None, "-p", "--prompt", help="prompt text; '-' reads stdin"),
    file: Path | None = typer.Option(None, "-f", "--file", help="read the prompt from a file"),
    max_tokens: int = typer.Option(256, "-n", "--max-tokens", help="tokens to generate at most"),
    ctx_size: int = typer.Option(
        0, "-c", "--ctx-size", help="context size (0: the model's, capped at 4096)"
    ),
    temp: float = typer.Option(0.8, "--temp", help="temperature; 0 is greedy"),
    top_k: int = typer.Option(40, "--top-k"),
    top_p: float = typer.Option(0.95, "--top-p"),
    min_p: float = typer.Option(0.05, "--min-p"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty"),
    repeat_last_n: int = typer.Option(64, "--repeat-last-n"),
    seed: int = typer.Option(-1, "-s", "--seed", help="RNG seed (-1: random)"),
    system: str | None = typer.Option(
        None, "--system", help="system message for the chat template"
    ),
    raw: bool = typer.Option(False, "--raw", help="no chat template: the prompt goes in as-is"),
    grammar: str | None = typer.Option(
        None, "--grammar", help="constrain the output to a grammar (llama.cpp GBNF, or Lark)"
    ),
    grammar_file: Path | None = typer.Option(
        None, "--grammar-file", help="read --grammar from a file"
    ),
    json_schema: str | None = typer.Option(
        None,
        "-j",
        "--json-schema",
        help="constrain the output to JSON valid under this schema (JSON text or a file); "
        "'{}' for any JSON",
    ),
    json_schema_file: Path | None = typer.Option(
        None, "-jf", "--json-schema-file", help="read --json-schema from a file"
    ),
    regex: str | None = typer.Option(
        None, "--regex", help="constrain the output to match this regular expression"
    ),
    backend: str = _backend_option("auto", "auto|numpy|metal|cuda"),
    as_json: bool = typer.Option(
        False, "--json", help="print one JSON object instead of streaming text"
    ),
    check_tensors: bool = typer.Option(
        False, "--check-tensors", help="scan every weight for NaN/Inf at load"
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Generate text from a prompt."""
    global _verbose
    _verbose = verbose
    from .generate import GenerationStats
    from .report import ledger_summary

    _check_range("-n/--max-tokens", max_tokens, 0)
    _check_range("-c/--ctx-size", ctx_size, 0)
    _check_range("--temp", temp, 0)
    _check_range("--top-k", top_k, 0)
    _check_range("--top-p", top_p, 0, 1)
    _check_range("--min-p", min_p, 0, 1)
    _check_range("--repeat-penalty", repeat_penalty, 0)
    _check_range("--repeat-last-n", repeat_last_n, -1)
    text_in = _read_prompt(prompt, file, ctx_size)
    if system is not None:
        _check_utf8(system, "--system")
    constrain = _constraint_args(grammar, grammar_file, json_schema, json_schema_file, regex)

    m = _load(model, backend, quiet=as_json and not verbose, check_tensors=check_tensors)
    # Compiled before the prompt runs: a grammar that does not compile stops here.
    constraint = m.constraint(**constrain)
    n_ctx = ctx_size or min(m.config.n_ctx_train, 4096)
    notes: list[str] = []
    # The ids first (not a string into generate) so the template's notes show before the text.
    ids = m.prompt_ids(text_in, raw=raw, system=system, notes=notes, n_ctx=n_ctx)
    for note in notes:
        err.print(f"note: {printable(note)}", style="dim", markup=False)
    stats = GenerationStats()
    pieces: list[str] = []
    # gpt-oss's harmony channels: the final one is the answer (stdout); the others go to
    # stderr with -v, and into the JSON output by name.
    channels: dict[str, list[str]] = {}
    out = sys.stdout
    # On a terminal, a control sequence the model writes shows as its escape (it would
    # drive the terminal); a pipe or file gets the text exactly.
    shown = terminal_text if _is_terminal(out) else (lambda text: text)
    sampling = dict(
        temperature=temp,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repeat_penalty=repeat_penalty,
        repeat_last_n=repeat_last_n,
        seed=None if seed < 0 else seed,
    )
    generated = _generated(m, ids, raw, max_tokens, ctx_size or None, stats, sampling, constraint)
    for channel, piece in generated:
        if channel != FINAL:
            channels.setdefault(channel, []).append(piece)
            if _verbose and not as_json:
                err.print(printable(piece), style="dim", markup=False, highlight=False, end="")
            continue
        pieces.append(piece)
        if not as_json:
            out.write(shown(piece))
            out.flush()
    peak = _peak_memory_mib()
    ledger = ledger_summary(m.decoder.backend)
    if as_json:
        out.write(
            json.dumps(
                {
                    "text": "".join(pieces),
                    "model": str(m.checkpoint.path),
                    "backend": m.backend_name,
                    "prompt_tokens": stats.prompt_tokens,
                    "prompt_ids": list(map(int, ids)),
                    "token_ids": list(map(int, stats.token_ids)),
                    "stop_reason": stats.stop_reason,
                    **(
                        {"channels": {k: "".join(v) for k, v in channels.items()}}
                        if channels
                        else {}
                    ),
                    "timings": {
                        "prompt_seconds": stats.prompt_seconds,
                        "prompt_tokens_per_second": stats.prompt_tps,
                        "generate_seconds": stats.generate_seconds,
                        "generated_tokens": stats.generated_tokens,
                        "generate_tokens_per_second": stats.generate_tps,
                    },
                    "peak_memory_mib": peak,
                    "device": ledger,
                },
                ensure_ascii=False,
            )
            + "\n"
        )
        return
    out.write("\n")
    out.flush()
    err.print(
        f"[dim]prompt: {stats.prompt_tokens} tokens, {stats.prompt_tps:.1f} tok/s | "
        f"generated: {stats.generated_tokens} tokens, {stats.generate_tps:.1f} tok/s | "
        f"peak memory: {peak:.0f} MiB | backend: {m.backend_name}[/dim]"
    )
    if ledger is not None and _verbose:
        err.print(
            f"[dim]device: {ledger['submissions']} submissions ("
            + ", ".join(f"{k} {v}" for k, v in ledger["by_kind"].items())
            + ")"
            + "".join(f" | refused x{v}: {k}" for k, v in ledger["refusals"].items())
            + "".join(f" | FAILED x{v}: {k}" for k, v in ledger["failures"].items())
            + "[/dim]",
            markup=True,
            highlight=False,
        )


@app.command()
def info(
    model: str | None = typer.Argument(None, help="GGUF file, HF directory or model name"),
    as_json: bool = typer.Option(False, "--json"),
    backend: str = _backend_option(
        "numpy",
        "say which layers this backend takes and how it holds each tensor type (numpy|metal|cuda)",
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Describe a model: architecture, sizes, tensor types, layers, tokenizer."""
    global _verbose
    _verbose = verbose
    from .pull import resolve_model_arg
    from .report import describe

    path = resolve_model_arg(model)
    data = describe(path, backend)
    if as_json:
        sys.stdout.write(json.dumps(data) + "\n")
        return
    _print_info(data)


def _print_info(d: dict[str, Any]) -> None:
    """`frink info`'s text: report.describe's data, one fact a line."""
    p = sys.stdout.write

    def line(label: str, text: str) -> None:
        p(f"{label + ':':<16}{text}\n")

    n_layer, be, moe, g = d["n_layer"], d["backend"]["name"], d["moe"], d["gdn"]
    size = f"{d['file_bytes'] / 1e6:.1f} MB"
    line("model", f"{printable(str(d['name'] or Path(d['path']).name))} ({d['format']}, {size})")
    line("architecture", f"{d['architecture']}, {d['parameters'] / 1e6:.1f}M parameters")
    line("tensor types", ", ".join(f"{k} x{v}" for k, v in sorted(d["tensor_types"].items())))
    line("layers", f"{n_layer} ({d['layer_pattern']})")
    # Where every FFN is routed the dense width is unused (or absent): say so instead.
    all_routed = moe and moe["layers"] == n_layer
    ffn_width = "routed" if all_routed and not moe["parallel_dense"] else d["n_ff"]
    window = f", sliding window {d['sliding_window']}" if d["sliding_window"] else ""
    heads = f"{d['n_head']} heads, {d['n_head_kv']} KV heads, head dim {d['head_dim']}"
    if d["per_layer_sizes"]:  # the largest of each: every layer's own are listed below
        heads = f"up to {heads} (per layer below)"
        ffn_width = f"up to {ffn_width}"
    mb = d["mamba"]
    # A pure mamba stack has no attention, no FFN, no rope: the mixer's sizes instead.
    hybrid = mb and any(s["mixer"] not in ("mamba", "mamba2") for s in d["layers"])
    if mb and not hybrid:
        line("embedding", f"{d['n_embd']}, vocab {d['n_vocab']}")
    else:
        line("embedding", f"{d['n_embd']}, ffn {ffn_width} ({d['ffn_act']}), vocab {d['n_vocab']}")
        line("attention", heads + window)
    if mb:
        norms = ", RMSNorm on dt/B/C" if mb["dt_b_c_rms"] else ""
        if mb["n_group"]:
            sizes = (
                f"{mb['dt_rank']} heads x {mb['d_inner'] // mb['dt_rank']},"
                f" {mb['n_group']} B/C groups"
            )
            label = "mamba2"
        else:
            sizes, label = f"dt rank {mb['dt_rank']}", "mamba"
        line(
            label,
            f"inner {mb['d_inner']}, state {mb['d_state']}, {sizes},"
            f" conv {mb['conv_kernel']}{norms}",
        )
        state_kib = d["recurrent_state_bytes"] / 1024
        line("recurrent", f"{state_kib:.1f} KiB state per sequence (f32 conv + scan)")
    line("positions", d["positions"])
    values = d["decoration_values"]
    decorations = [
        f"{name} {values[name]:g}" if isinstance(values.get(name), float) else name
        for name in d["decorations"]
    ]
    line("decorations", ", ".join(decorations) or "none")
    if g:
        line(
            "gated deltanet",
            f"{g['layers']} layers, {g['key_heads']} key / {g['value_heads']} value heads"
            f" x {g['head_dim_k']}/{g['head_dim_v']}, conv {g['conv_kernel']},"
            f" value heads {g['value_head_order']}",
        )
        state_kib = d["recurrent_state_bytes"] / 1024
        line("recurrent", f"{state_kib:.1f} KiB state per sequence (f32 conv + delta)")
    sc = d["shortconv"]
    if sc:
        line("short conv", f"{sc['layers']} layers, conv {sc['conv_kernel']} over {d['n_embd']}")
        state_kib = d["recurrent_state_bytes"] / 1024
        line("recurrent", f"{state_kib:.1f} KiB state per sequence (f32 conv tail)")
    if moe:
        shared = f", shared expert ffn {moe['shared_ff']}" if moe["shared_ff"] else ""
        gating = ""
        if moe["gating"] != "softmax" or moe["expert_bias"]:
            gating = f", {moe['gating']} router" + (" + expert bias" if moe["expert_bias"] else "")
        line(
            "experts",
            f"{moe['experts']}, top {moe['experts_used']}, expert ffn {moe['expert_ff']}"
            f"{shared}{gating}",
        )
    line("context", str(d["context_length"]))
    t = d["tokenizer"]
    if t is None:
        line("tokenizer", "none")
    else:
        line(
            "tokenizer",
            f"{t['model']}, {t['n_vocab']} tokens, bos {t['bos_id']}, eos {t['eos_id']}",
        )
    line("chat template", "yes" if d["chat_template"] else "no")
    host = d["host"]
    line("host kernels", host["kernels"])
    line("host rowwise", host["rowwise"])
    for dtype, how in host["tensor_formats"].items():
        p(f"  {dtype:<6} -> {how}\n")
    if be != "numpy":
        taken = d["backend"]["layers_taken"]
        rest = "(prefill and decode; the host body runs the rest)"
        line("backend", f"{be} takes {taken} of {n_layer} layers {rest}")
        for dtype, how in d["backend"]["tensor_formats"].items():
            p(f"  {dtype:<6} -> {how}\n")
    alibi = d["positions"].startswith("alibi")
    for s in d["layers"]:
        where = ""
        if be != "numpy":
            where = f"  [{be}]" if s["refusal"] is None else f"  [host ({s['refusal']})]"
        if s["mixer"] == "gdn":
            mixer = f"gdn ({g['key_heads']}k/{g['value_heads']}v x {g['head_dim_k']})"
        elif s["mixer"] == "mamba":
            mixer = f"mamba ({mb['d_inner']} x {mb['d_state']})"
        elif s["mixer"] == "shortconv":
            mixer = f"shortconv (conv {sc['conv_kernel']})"
        elif s["mixer"] == "mamba2":
            mixer = f"mamba2 ({mb['dt_rank']} heads, {mb['d_inner']} x {mb['d_state']})"
        elif s["mixer"] == "none":
            mixer = "no attention"
        elif s["mixer"] == "linear":
            mixer = f"linear (wo only, {s['n_head']}q)"
        else:
            win = f" window {s['window']}" if s["window"] else ""
            # The layer's own head counts (they differ per layer in openelm and deci).
            shape = f"{s['n_head']}q/{s['n_head_kv']}kv x {s['head_dim']}"
            if s.get("kv_source") is not None:  # gemma4's KV sharing
                shape += f", K/V of blk.{s['kv_source']}"
            where_pos = "alibi" if alibi else f"rope {s['rope_base']:g}"
            mixer = f"{s['mixer']} ({shape}, {where_pos}{win})"
        if s["ffn"] == "moe":
            ffn = f"moe ffn {moe['experts']}x{moe['expert_ff']}"
        elif s["ffn"] == "dense+moe":
            ffn = f"dense ffn {s['n_ff']} + moe ffn {moe['experts']}x{moe['expert_ff']}"
        elif s["ffn"] == "none":
            ffn = "no ffn"
        else:
            ffn = f"{s['ffn']} ffn {s['n_ff']}"
        p(f"  blk.{s['layer']:<3} {mixer} + {ffn}{where}\n")
    for note in d["notes"]:
        p(f"note: {printable(note)}\n")


@app.command()
def bench(
    model: str | None = typer.Argument(None, help="GGUF file, HF directory or model name"),
    n_prompt: int = typer.Option(512, "-p", "--n-prompt", help="prompt test size (0: none)"),
    n_gen: int = typer.Option(128, "-n", "--n-gen", help="generation test size (0: none)"),
    n_depth: int = typer.Option(
        0, "-d", "--n-depth", help="tokens already in the context for each test (untimed)"
    ),
    repetitions: int = typer.Option(3, "-r", "--repetitions", help="timed repetitions per test"),
    threads: int = typer.Option(
        0, "-t", "--threads", help="threads for llama.cpp and frink (0: all cores)"
    ),
    backend: str = _backend_option("auto", "auto|numpy|metal|cuda"),
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
    as_json: bool = typer.Option(False, "--json", help="a JSON list of rows"),
    as_csv: bool = typer.Option(False, "--csv", help="CSV rows"),
    as_md: bool = typer.Option(False, "--md", help="a markdown table (the default)"),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Measure prompt and generation speed, llama-bench style."""
    global _verbose
    _verbose = verbose
    from . import bench as B

    if as_json + as_csv + as_md > 1:
        raise FrinkError("choose one output format: --json, --csv or --md")
    _check_range("-t/--threads", threads, 0)
    m = _load(model, backend)
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


@app.command()
def chat(
    model: str | None = typer.Argument(None, help="GGUF file, HF directory or model name"),
    ctx_size: int = typer.Option(
        0, "-c", "--ctx-size", help="context size (0: the model's, capped at 4096)"
    ),
    max_tokens: int = typer.Option(1024, "-n", "--max-tokens", help="tokens per answer at most"),
    system: str | None = typer.Option(None, "--system", help="system message"),
    temp: float = typer.Option(0.8, "--temp", help="temperature; 0 is greedy"),
    top_k: int = typer.Option(40, "--top-k"),
    top_p: float = typer.Option(0.95, "--top-p"),
    min_p: float = typer.Option(0.05, "--min-p"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty"),
    seed: int = typer.Option(-1, "-s", "--seed", help="RNG seed (-1: random)"),
    backend: str = _backend_option("auto", "auto|numpy|metal|cuda"),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Chat with the model in the terminal (/reset, /system TEXT, /exit; Ctrl-C stops an
    answer)."""
    global _verbose
    _verbose = verbose
    from .repl import chat_loop
    from .sampling import SamplingParams

    _check_range("-c/--ctx-size", ctx_size, 0)
    _check_range("-n/--max-tokens", max_tokens, 1)
    if system is not None:
        _check_utf8(system, "--system")
    params = SamplingParams(
        temperature=temp,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repeat_penalty=repeat_penalty,
        seed=None if seed < 0 else seed,
    )
    m = _load(model, backend)
    chat_loop(
        m,
        n_ctx=ctx_size or min(m.config.n_ctx_train, 4096),
        params=params,
        max_tokens=max_tokens,
        system=system,
        out=sys.stdout,
        note=lambda line: err.print(printable(line), style="dim", markup=False),
    )


@app.command()
def serve(
    model: str | None = typer.Argument(None, help="GGUF file, HF directory or model name"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8080, "--port", help="port to listen on (0: any free port)"),
    parallel: int = typer.Option(4, "-np", "--parallel", help="sequences decoded together (slots)"),
    ctx_size: int = typer.Option(
        0, "-c", "--ctx-size", help="context per sequence (0: the model's, capped at 4096)"
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", help="require Authorization: Bearer KEY", envvar="FRINK_API_KEY"
    ),
    api_key_file: Path | None = typer.Option(
        None,
        "--api-key-file",
        help="read the API key from this file's first line (it stays out of `ps`)",
    ),
    alias: str | None = typer.Option(None, "--alias", help="the model name clients see"),
    prefill_chunk: int = typer.Option(
        128, "--prefill-chunk", help="prompt rows fed per step beside the running streams"
    ),
    queue: int = typer.Option(64, "--queue", help="requests waiting at most (then 503)"),
    max_body: int = typer.Option(
        8 << 20, "--max-body", help="largest request body in bytes (then 413)"
    ),
    timeout: float = typer.Option(
        60.0,
        "-to",
        "--timeout",
        help="seconds a client may leave a request body unsent or an answer unread "
        "(then its connection closes); a request head gets min(10, this)",
    ),
    max_connections: int = typer.Option(
        256,
        "--max-connections",
        help="open connections at most (kept below the file-descriptor limit); past it the "
        "longest-idle one is closed",
    ),
    cors_origins: str = typer.Option(
        "",
        "--cors-origins",
        help="comma-separated web origins (https://app.example) whose pages may call this "
        "server ('*': any); other browser requests get a 403",
    ),
    parse_special: bool = typer.Option(
        False,
        "--parse-special",
        help="read control tokens written in message content and prompts as control tokens "
        "(llama-server's behaviour: a client's text can then forge chat turns)",
    ),
    backend: str = _backend_option("auto", "auto|numpy|metal|cuda"),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API, with continuous batching."""
    global _verbose
    _verbose = verbose
    from .serve.server import serve as run_server

    _check_range("-np/--parallel", parallel, 1, 256)
    _check_range("-c/--ctx-size", ctx_size, 0)
    _check_range("--port", port, 0, 65535)
    _check_range("--prefill-chunk", prefill_chunk, 1)
    _check_range("--queue", queue, 0)
    _check_range("--max-body", max_body, 1)
    _check_range("--timeout", timeout, 0.1, 86400)
    _check_range("--max-connections", max_connections, 1)
    api_key = _api_key(api_key, api_key_file)
    origins = frozenset(o.strip().rstrip("/") for o in cors_origins.split(",") if o.strip())
    m = _load(model, backend)
    run_server(
        m,
        host=host,
        port=port,
        n_parallel=parallel,
        n_ctx=ctx_size or min(m.config.n_ctx_train, 4096),
        api_key=api_key,
        alias=alias,
        prefill_chunk=prefill_chunk,
        max_queue=queue,
        max_body=max_body,
        announce=lambda line: err.print(f"frink: {printable(line)}", markup=False),
        timeout=timeout,
        max_connections=max_connections,
        cors_origins=origins,
        parse_special=parse_special,
    )
    err.print("frink: server stopped", markup=False)


def _api_key(key: str | None, file: Path | None) -> str | None:
    """The server's API key, from --api-key (or FRINK_API_KEY) or --api-key-file's first
    line."""
    if key is not None and file is not None:
        raise FrinkError("give the API key with --api-key or --api-key-file, not both")
    if file is not None:
        try:
            from .formats.jsonfile import open_regular

            with open_regular(file) as f:
                raw = f.read(4097)
        except OSError as e:
            raise FrinkError(f"cannot read --api-key-file {file}: {e.strerror or e}") from None
        if len(raw) > 4096:
            raise FrinkError(f"--api-key-file {file} is longer than 4096 bytes")
        try:
            key = raw.decode("utf-8").splitlines()[0].strip() if raw.strip() else ""
        except UnicodeDecodeError:
            raise FrinkError(f"--api-key-file {file} is not UTF-8 text") from None
        if not key:
            raise FrinkError(f"--api-key-file {file} is empty")
    if key is not None:
        if not key:
            raise FrinkError("--api-key is empty")
        _check_utf8(key, "--api-key")
    return key


@app.command()
def parity(
    model: str | None = typer.Argument(None, help="GGUF file, HF directory or model name"),
    backend: str = _backend_option("metal", "the backend to check: metal|cuda", ("metal", "cuda")),
    prompt: str | None = typer.Option(
        None, "-p", "--prompt", help="prompt text (BOS per the file)"
    ),
    n_tokens: int = typer.Option(
        0, "--tokens", help="N seeded synthetic token ids instead of a prompt"
    ),
    steps: int = typer.Option(32, "--steps", help="greedy decode steps compared after the prefill"),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Check that an accelerated backend computes the same model as the host body."""
    global _verbose
    _verbose = verbose
    from .parity import check_parity

    _check_range("--steps", steps, 0)
    _check_range("--tokens", n_tokens, 0)
    if prompt is not None and n_tokens:
        raise FrinkError("give --prompt or --tokens, not both")
    m = _load(model, backend, quiet=as_json)
    if n_tokens or prompt is None:
        rng = np.random.default_rng(0)
        ids = rng.integers(0, m.config.n_vocab, size=n_tokens or 16).tolist()
    else:
        ids = m.tokenize(prompt)
    r = check_parity(m, ids, steps)
    if as_json:
        sys.stdout.write(json.dumps(r.as_dict()) + "\n")
    else:
        p = sys.stdout.write
        p(
            f"backend {r.backend}: {r.n_prompt} prompt tokens, {r.steps} decode steps, "
            f"{'quantized' if r.quantized else 'unquantized'} weights (KL bar {r.kl_bar:g})\n"
        )
        for i, (d, on) in enumerate(zip(r.layer_max_abs, r.layer_on_backend)):
            p(f"  layer {i:<3} {'device' if on else 'host  '}  max|d| {d:.3g}\n")
        p(f"prefill logits max|d| {r.prefill_logits_max_abs:.3g}\n")
        p(
            f"decode: max KL {max(r.step_kl):.3g}, top-1 agreement "
            f"{sum(r.step_top1_agree)}/{len(r.step_top1_agree)}\n"
        )
        p(
            f"submissions: prefill {r.submissions_prefill}, per decode token "
            f"{r.submissions_per_decode_token:.2f}; by kind {r.submissions_by_kind}; "
            f"refusals {r.refusals}\n"
        )
        for message, n in r.failures.items():
            p(f"FAILED x{n}: {message}\n")
        p(f"verdict: {r.verdict} ({r.why})\n")
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


def _fail(message: str, code: int = 1) -> None:
    """The one error line (file-supplied text escaped), then exit; never a second failure
    if stderr itself is gone."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        err.print(f"frink: {printable(message)}", markup=False)
    _quiet_exit(code)


def _quiet_exit(code: int) -> None:
    # The interpreter flushes stdout once more at exit; on a closed pipe or a full disk that
    # flush fails again and prints a second, traceback-like line. Point it at /dev/null.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    sys.exit(code)


def _check_streams() -> None:
    """stdout closed (`>&-`) leaves sys.stdout None: say so instead of a traceback later."""
    if sys.stdout is None or sys.stderr is None:
        if sys.stderr is not None:
            sys.stderr.write("frink: error: stdout is closed\n")
        os._exit(1)


def main() -> None:
    _check_streams()
    if hasattr(signal, "SIGPIPE"):
        # `frink run ... | head`: end quietly when the reader goes away, as cat does.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # A corrupt model's overflow shows as NumPy RuntimeWarnings (with their source lines)
    # before the NaN guard's one line says what it means; that line is the report.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"frink_cli(\.|$)")
    # Ctrl-C is KeyboardInterrupt even where the parent started frink with SIGINT ignored
    # (a shell's background job), which would otherwise run on and exit 0.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            if interrupt.pending():
                raise KeyboardInterrupt
            # Typer turns Ctrl-C (and typer.Exit(n)) into a returned exit code when not
            # standalone: 130 is its KeyboardInterrupt, anything else non-zero an Exit.
            code = app(standalone_mode=False)
            if code == 130:
                raise KeyboardInterrupt
            if isinstance(code, int) and not isinstance(code, bool) and code:
                _quiet_exit(code)
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()  # a full disk shows here, inside the handlers below
    except _ABORTS + (KeyboardInterrupt,):
        _fail("interrupted", 130)
    except _HELP_ERRORS as e:  # bare `frink`: the help text, not an error line
        e.show()
        sys.exit(e.exit_code)
    except _USAGE_ERRORS as e:
        if _verbose:
            traceback.print_exc()
        _fail(f"error: {e.format_message()}", e.exit_code or 2)
    except FrinkError as e:
        if _verbose:
            traceback.print_exc()
        _fail(f"error: {e}")
    except BrokenPipeError:
        _quiet_exit(0)
    except MemoryError:
        _fail("error: out of memory")
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EIO, errno.EBADF, errno.EDQUOT, errno.EFBIG):
            # stdout on a full disk or a closed descriptor: the answer cannot be written.
            _fail(f"error: cannot write output ({e.strerror})")
        raise


if __name__ == "__main__":
    main()
