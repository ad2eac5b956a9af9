"""The `frink` command. Thin: parse flags, call the library, print.

Stdout carries the answer alone (generated text, or one JSON object with --json);
progress, logs and stats go to stderr. A bad input (FrinkError, or a flag click rejects)
ends with one line on stderr and a non-zero exit; -v adds the traceback.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import traceback
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import click
import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from . import interrupt
from .backends import BACKEND_NAMES
from .errors import FrinkError, printable

if TYPE_CHECKING:  # the api (numpy, the model code) is imported lazily, per command
    from .api import Model

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
# both so a bad flag is one line under either.
_USAGE_ERRORS: tuple[type[Exception], ...] = (click.exceptions.ClickException,)
_ABORTS: tuple[type[BaseException], ...] = (click.exceptions.Abort, typer.Abort)
_HELP_ERRORS: tuple[type[Exception], ...] = tuple(
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


def _load(model_arg: Optional[str], backend: str, quiet: bool = False, check_tensors: bool = False):
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


# Bytes of prompt read per token of context at most: no vocabulary has tokens near this
# long, so a longer input cannot fit, and reading stops there (`-f /dev/zero` ends).
_PROMPT_BYTES_PER_TOKEN = 1024


def _read_prompt(prompt: Optional[str], file: Optional[Path], n_ctx: int = 0) -> str:
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
            raise FrinkError(f"cannot read the prompt from stdin: {getattr(e, 'strerror', e)}") from None
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


def _check_range(name: str, value: float, lo: float | None = None, hi: float | None = None) -> None:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise FrinkError(f"invalid value for {name}: {value} (must be {bounds})")


@app.command()
def run(
    model: Optional[str] = typer.Argument(None, help="GGUF file, HF directory, or a model name from `frink models` (default: smollm2-135m)"),
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="prompt text; '-' reads stdin"),
    file: Optional[Path] = typer.Option(None, "-f", "--file", help="read the prompt from a file"),
    max_tokens: int = typer.Option(256, "-n", "--max-tokens", help="tokens to generate at most"),
    ctx_size: int = typer.Option(0, "-c", "--ctx-size", help="context size (0: the model's, capped at 4096)"),
    temp: float = typer.Option(0.8, "--temp", help="temperature; 0 is greedy"),
    top_k: int = typer.Option(40, "--top-k"),
    top_p: float = typer.Option(0.95, "--top-p"),
    min_p: float = typer.Option(0.05, "--min-p"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty"),
    repeat_last_n: int = typer.Option(64, "--repeat-last-n"),
    seed: int = typer.Option(-1, "-s", "--seed", help="RNG seed (-1: random)"),
    system: Optional[str] = typer.Option(None, "--system", help="system message for the chat template"),
    raw: bool = typer.Option(False, "--raw", help="no chat template: the prompt goes in as-is"),
    backend: str = typer.Option("auto", "--backend", help="auto|numpy|metal|cuda"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of streaming text"),
    check_tensors: bool = typer.Option(False, "--check-tensors", help="scan every weight for NaN/Inf at load"),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Generate text from a prompt."""
    global _verbose
    _verbose = verbose
    from .generate import GenerationStats

    _check_range("-n/--max-tokens", max_tokens, 0)
    _check_range("-c/--ctx-size", ctx_size, 0)
    _check_range("--temp", temp, 0)
    _check_range("--top-k", top_k, 0)
    _check_range("--top-p", top_p, 0, 1)
    _check_range("--min-p", min_p, 0, 1)
    _check_range("--repeat-penalty", repeat_penalty, 0)
    _check_range("--repeat-last-n", repeat_last_n, -1)
    if backend not in BACKEND_NAMES:
        raise FrinkError(f"invalid value for --backend: {backend!r} (choose from {', '.join(BACKEND_NAMES)})")
    text_in = _read_prompt(prompt, file, ctx_size)
    if system is not None:
        _check_utf8(system, "--system")

    m = _load(model, backend, quiet=as_json and not verbose, check_tensors=check_tensors)
    n_ctx = ctx_size or min(m.config.n_ctx_train, 4096)
    notes: list[str] = []
    ids = m.prompt_ids(text_in, raw=raw, system=system, notes=notes, n_ctx=n_ctx)
    for note in notes:
        err.print(f"note: {printable(note)}", style="dim", markup=False)
    stats = GenerationStats()
    sampling = dict(
        temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
        repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
        seed=None if seed < 0 else seed,
    )
    stream = m.tokenizer.stream()
    pieces: list[str] = []
    out = sys.stdout
    for token in m.generate_ids(ids, max_tokens=max_tokens, n_ctx=n_ctx, stats=stats, **sampling):
        piece = stream.push(token)
        if piece:
            pieces.append(piece)
            if not as_json:
                out.write(piece)
                out.flush()
    tail = stream.flush()
    if tail:
        pieces.append(tail)
        if not as_json:
            out.write(tail)
    text = "".join(pieces)
    peak = _peak_memory_mib()
    if as_json:
        out.write(json.dumps({
            "text": text,
            "model": str(m.checkpoint.path),
            "backend": m.backend_name,
            "prompt_tokens": stats.prompt_tokens,
            "prompt_ids": list(map(int, ids)),
            "token_ids": list(map(int, stats.token_ids)),
            "stop_reason": stats.stop_reason,
            "timings": {
                "prompt_seconds": stats.prompt_seconds,
                "prompt_tokens_per_second": stats.prompt_tps,
                "generate_seconds": stats.generate_seconds,
                "generated_tokens": stats.generated_tokens,
                "generate_tokens_per_second": stats.generate_tps,
            },
            "peak_memory_mib": peak,
            "device": _ledger_summary(m),
        }, ensure_ascii=False) + "\n")
    else:
        out.write("\n")
        out.flush()
        err.print(
            f"[dim]prompt: {stats.prompt_tokens} tokens, {stats.prompt_tps:.1f} tok/s | "
            f"generated: {stats.generated_tokens} tokens, {stats.generate_tps:.1f} tok/s | "
            f"peak memory: {peak:.0f} MiB | backend: {m.backend_name}[/dim]"
        )
        ledger = _ledger_summary(m)
        if ledger is not None and _verbose:
            err.print(
                f"[dim]device: {ledger['submissions']} submissions ("
                + ", ".join(f"{k} {v}" for k, v in ledger["by_kind"].items()) + ")"
                + "".join(f" | refused x{v}: {k}" for k, v in ledger["refusals"].items())
                + "".join(f" | FAILED x{v}: {k}" for k, v in ledger["failures"].items())
                + "[/dim]",
                markup=True, highlight=False,
            )


def _tensor_formats(backend: str, types: Counter) -> dict[str, str]:
    """Per tensor type, how `backend` holds it on the device (none: the host's f32)."""
    if backend == "metal":
        from .backends.mlx.quant import device_format

        return {t: device_format(t) for t in sorted(types)}
    if backend == "cuda":
        from .backends.cupy import tensor_format

        return {t: tensor_format(t) for t in sorted(types)}
    return {}


def _ledger_summary(m: Model) -> dict | None:
    """The backend ledger of this run (None on the host body): device submissions by
    kind, refusals by reason, failures by message."""
    ledger = getattr(m.decoder.backend, "ledger", None)
    if ledger is None:
        return None
    return {
        "submissions": ledger.total(),
        "by_kind": dict(sorted(ledger.submissions.items())),
        "refusals": dict(sorted(ledger.refusals.items())),
        "failures": dict(ledger.failures),
    }


@app.command()
def info(
    model: Optional[str] = typer.Argument(None, help="GGUF file, HF directory or model name"),
    as_json: bool = typer.Option(False, "--json"),
    backend: str = typer.Option("numpy", "--backend", help="say which layers this backend takes and how it holds each tensor type (numpy|metal|cuda)"),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Describe a model: architecture, sizes, tensor types, layers, tokenizer."""
    global _verbose
    _verbose = verbose
    from .backends import layer_support
    from .formats import open_checkpoint
    from .model import config_from_checkpoint
    from .pull import resolve_model_arg
    from .tokenizer import load_tokenizer

    path = resolve_model_arg(model)
    ckpt = open_checkpoint(path)
    cfg = config_from_checkpoint(ckpt)
    if backend not in BACKEND_NAMES:
        raise FrinkError(f"invalid value for --backend: {backend!r} (choose from {', '.join(BACKEND_NAMES)})")
    # From the backend's own eligibility predicate: no device, no weights needed.
    support = layer_support(backend, cfg)
    backend_label = "numpy" if backend == "auto" else backend
    tok = load_tokenizer(ckpt)
    names = ckpt.tensors.names()
    types = Counter(ckpt.tensors.info(n).dtype for n in names)
    n_params = sum(int(np.prod(ckpt.tensors.info(n).shape)) for n in names)
    size = sum(f.stat().st_size for f in Path(path).glob("*.safetensors")) if Path(path).is_dir() else Path(path).stat().st_size
    layers = []
    for i in range(cfg.n_layer):
        s = cfg.layer_shape(i)
        layers.append({"layer": i, "mixer": s.mixer, "ffn": s.ffn, "window": s.window, "rope_base": s.rope_base,
                       "backend": backend_label if support[i] is None else "host", "refusal": support[i]})
    data = {
        "path": str(path),
        "format": ckpt.format,
        "architecture": cfg.arch,
        "name": ckpt.metadata.get("general.name"),
        "file_bytes": size,
        "parameters": n_params,
        "tensor_types": dict(types),
        "n_layer": cfg.n_layer,
        "n_embd": cfg.n_embd,
        "n_head": cfg.n_head,
        "n_head_kv": cfg.n_head_kv,
        "head_dim": cfg.head_dim_k,
        "n_ff": cfg.n_ff,
        "n_vocab": cfg.n_vocab,
        "context_length": cfg.n_ctx_train,
        "rope": {"type": cfg.rope_type, "base": cfg.rope_base, "dim": cfg.rope_dim},
        "sliding_window": cfg.sliding_window,
        "layer_pattern": cfg.layer_pattern(),
        "gdn": None if not any(cfg.recurrent_layers) else {
            "layers": sum(cfg.recurrent_layers), "key_heads": cfg.ssm_n_k_heads,
            "value_heads": cfg.ssm_n_v_heads, "head_dim_k": cfg.ssm_head_dim_k,
            "head_dim_v": cfg.ssm_head_dim_v, "conv_kernel": cfg.ssm_conv_kernel,
            "value_head_order": cfg.ssm_v_head_order,
        },
        "recurrent_state_bytes": cfg.recurrent_state_bytes() if any(cfg.recurrent_layers) else 0,
        "moe": None if not any(cfg.moe_layers) else {
            "layers": sum(cfg.moe_layers), "experts": cfg.n_expert, "experts_used": cfg.n_expert_used,
            "expert_ff": cfg.n_ff_exp, "shared_ff": cfg.n_ff_shexp, "norm_topk": cfg.moe_norm_topk,
        },
        "tied_embeddings": cfg.tied_embeddings,
        "tokenizer": None if tok is None else {
            "model": ckpt.metadata.get("tokenizer.ggml.model", "tokenizer.json"),
            "n_vocab": tok.n_vocab, "bos_id": tok.bos_id, "eos_id": tok.eos_id,
            "add_bos": tok.add_bos,
        },
        "chat_template": tok is not None and tok.chat_template is not None,
        "layers": layers,
        "backend": {"name": backend_label, "layers_taken": sum(r is None for r in support),
                    "tensor_formats": _tensor_formats(backend_label, types)},
        "notes": ckpt.notes,
    }
    if as_json:
        sys.stdout.write(json.dumps(data) + "\n")
        return
    p = sys.stdout.write
    p(f"model:          {printable(str(data['name'] or Path(path).name))} ({ckpt.format}, {size / 1e6:.1f} MB)\n")
    p(f"architecture:   {cfg.arch}, {n_params / 1e6:.1f}M parameters\n")
    p(f"tensor types:   {', '.join(f'{k} x{v}' for k, v in sorted(types.items()))}\n")
    p(f"layers:         {cfg.n_layer} ({cfg.layer_pattern()})\n")
    # Where every FFN is routed the dense width is unused (or absent): say so instead.
    ffn_width = "routed" if cfg.moe_layers and all(cfg.moe_layers) else cfg.n_ff
    p(f"embedding:      {cfg.n_embd}, ffn {ffn_width} ({cfg.ffn_act}), vocab {cfg.n_vocab}\n")
    p(f"attention:      {cfg.n_head} heads, {cfg.n_head_kv} KV heads, head dim {cfg.head_dim_k}"
      + (f", sliding window {cfg.sliding_window}" if cfg.sliding_window else "") + "\n")
    p(f"rope:           {cfg.rope_type}, base {cfg.rope_base:g}, {cfg.rope_dim} dims\n")
    if data["gdn"]:
        g = data["gdn"]
        p(f"gated deltanet: {g['layers']} layers, {g['key_heads']} key / {g['value_heads']} value heads"
          f" x {g['head_dim_k']}/{g['head_dim_v']}, conv {g['conv_kernel']}, value heads {g['value_head_order']}\n")
        p(f"recurrent:      {data['recurrent_state_bytes'] / 1024:.1f} KiB state per sequence (f32 conv + delta)\n")
    if data["moe"]:
        e = data["moe"]
        p(f"experts:        {e['experts']}, top {e['experts_used']}, expert ffn {e['expert_ff']}"
          + (f", shared expert ffn {e['shared_ff']}" if e["shared_ff"] else "") + "\n")
    p(f"context:        {cfg.n_ctx_train}\n")
    if tok is None:
        p("tokenizer:      none\n")
    else:
        t = data["tokenizer"]
        p(f"tokenizer:      {t['model']}, {tok.n_vocab} tokens, bos {tok.bos_id}, eos {tok.eos_id}\n")
    p(f"chat template:  {'yes' if data['chat_template'] else 'no'}\n")
    if backend_label != "numpy":
        p(f"backend:        {backend_label} takes {data['backend']['layers_taken']} of {cfg.n_layer} layers"
          " (prefill and decode; the host body runs the rest)\n")
        for dtype, how in data["backend"]["tensor_formats"].items():
            p(f"  {dtype:<6} -> {how}\n")
    for i in range(cfg.n_layer):
        s = cfg.layer_shape(i)
        win = f" window {s.window}" if s.window else ""
        where = ""
        if backend_label != "numpy":
            where = f"  [{backend_label}]" if support[i] is None else f"  [host ({support[i]})]"
        if s.mixer == "gdn":
            mixer = f"gdn ({cfg.ssm_n_k_heads}k/{cfg.ssm_n_v_heads}v x {cfg.ssm_head_dim_k})"
        else:
            mixer = f"{s.mixer} ({cfg.n_head}q/{cfg.n_head_kv}kv x {cfg.head_dim_k}, rope {s.rope_base:g}{win})"
        ffn = f"moe ffn {cfg.n_expert}x{cfg.n_ff_exp}" if s.ffn == "moe" else f"{s.ffn} ffn {cfg.n_ff}"
        p(f"  blk.{i:<3} {mixer} + {ffn}{where}\n")
    for note in ckpt.notes:
        p(f"note: {printable(note)}\n")


@app.command()
def bench(
    model: str | None = typer.Argument(None, help="GGUF file, HF directory or model name"),
    n_prompt: int = typer.Option(512, "-p", "--n-prompt", help="prompt test size (0: none)"),
    n_gen: int = typer.Option(128, "-n", "--n-gen", help="generation test size (0: none)"),
    repetitions: int = typer.Option(3, "-r", "--repetitions", help="timed repetitions per test"),
    threads: int = typer.Option(0, "-t", "--threads", help="threads for llama.cpp and frink's BLAS (0: all cores)"),
    backend: str = typer.Option("auto", "--backend", help="auto|numpy|metal|cuda"),
    compare: str | None = typer.Option(None, "--compare", help="also run llama.cpp on the same GGUF"),
    submissions: bool = typer.Option(False, "--submissions", help="add device submissions and refusals"),
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
    if backend not in BACKEND_NAMES:
        raise FrinkError(f"invalid value for --backend: {backend!r} (choose from {', '.join(BACKEND_NAMES)})")
    m = _load(model, backend)
    rows = B.run_bench(
        m, n_prompt=n_prompt, n_gen=n_gen, repetitions=repetitions, n_threads=threads or None,
        compare=compare, submissions=submissions,
        progress=lambda msg: err.print(f"[dim]{msg}[/dim]", markup=True),
    )
    if as_json:
        sys.stdout.write(B.format_json(rows, submissions))
    elif as_csv:
        sys.stdout.write(B.format_csv(rows, submissions))
    else:
        sys.stdout.write(B.format_md(rows, submissions))


@app.command()
def parity(
    model: Optional[str] = typer.Argument(None, help="GGUF file, HF directory or model name"),
    backend: str = typer.Option("metal", "--backend", help="the backend to check: metal|cuda"),
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="prompt text (BOS per the file)"),
    n_tokens: int = typer.Option(0, "--tokens", help="N seeded synthetic token ids instead of a prompt"),
    steps: int = typer.Option(32, "--steps", help="greedy decode steps compared after the prefill"),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Check that an accelerated backend computes the same model as the host body."""
    global _verbose
    _verbose = verbose
    from .parity import check_parity

    if backend not in ("metal", "cuda"):
        raise FrinkError(f"invalid value for --backend: {backend!r} (parity checks metal or cuda)")
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
        p(f"backend {r.backend}: {r.n_prompt} prompt tokens, {r.steps} decode steps, "
          f"{'quantized' if r.quantized else 'unquantized'} weights (KL bar {r.kl_bar:g})\n")
        for i, (d, on) in enumerate(zip(r.layer_max_abs, r.layer_on_backend)):
            p(f"  layer {i:<3} {'device' if on else 'host  '}  max|d| {d:.3g}\n")
        p(f"prefill logits max|d| {r.prefill_logits_max_abs:.3g}\n")
        p(f"decode: max KL {max(r.step_kl):.3g}, top-1 agreement "
          f"{sum(r.step_top1_agree)}/{len(r.step_top1_agree)}\n")
        p(f"submissions: prefill {r.submissions_prefill}, per decode token "
          f"{r.submissions_per_decode_token:.2f}; by kind {r.submissions_by_kind}; "
          f"refusals {r.refusals}\n")
        p(f"verdict: {r.verdict}\n")
    if r.verdict == "WRONG":
        raise typer.Exit(1)


@app.command()
def pull(name: Optional[str] = typer.Argument(None, help="model name (default: smollm2-135m)")) -> None:
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
    try:
        err.print(f"frink: {printable(message)}", markup=False)
    except (OSError, ValueError, AttributeError):
        pass
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
    except (*_ABORTS, KeyboardInterrupt):
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
