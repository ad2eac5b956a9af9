"""What a model file is, as data: the facts `frink info` prints and `frink bench` labels its
rows with; and `frink info`'s text of them (print_info).

Why a module of its own: the report is library work (open the checkpoint, read its config
and tokenizer, ask a backend's eligibility predicate) that the CLI only prints, and bench
needs the same sizes and counts; computed here once, the two cannot disagree. Nothing here
loads weights or touches a device.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf import GGMLQuantizationType

from .archs import config_from_checkpoint, open_checkpoint
from .errors import printable
from .formats import Checkpoint
from .graph.trace import OpCall, model_traces
from .model.config import ModelConfig
from .model.mem_budget import Budget, budget_plan, kept_in_blocks
from .quant import kernels
from .quant.blocks import PANEL_ROWS

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


@dataclass(frozen=True)
class CheckpointFacts:
    file_bytes: int  # the GGUF file, or the *.safetensors files of an HF directory
    n_params: int
    tensor_types: dict[str, int]  # stored type -> how many tensors hold it


def checkpoint_facts(ckpt: Checkpoint) -> CheckpointFacts:
    names = ckpt.tensors.names()
    infos = [ckpt.tensors.info(n) for n in names]
    path = Path(ckpt.path)
    if path.is_dir():
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    else:
        size = path.stat().st_size
    return CheckpointFacts(
        file_bytes=size,
        n_params=sum(int(np.prod(i.shape)) for i in infos),
        tensor_types=dict(Counter(i.dtype for i in infos)),
    )


def tensor_formats(backend: str, types: Any, fmt: str) -> dict[str, str]:
    """Per tensor type, how `backend` holds it on the device (none: the host's f32)."""
    if backend == "metal":
        from .backends.mlx.quant import device_format

        return {t: device_format(t) for t in sorted(types)}
    if backend == "cuda":
        from .backends.cupy import tensor_format

        return {t: tensor_format(t, host_blocks=host_keeps_blocks(fmt, t)) for t in sorted(types)}
    return {}


def host_keeps_blocks(fmt: str, gguf_type: str) -> bool:
    """Whether the host body holds tensors of this type in the file's blocks (model/weights.py's
    rule, named in model/mem_budget.py): a GGUF file, the compiled kernels, a type they
    multiply."""
    return kept_in_blocks(fmt, gguf_type)


def host_formats(fmt: str, types: Any) -> dict[str, str]:
    """Per tensor type, how the host body holds it (the file's blocks, repacked in panels
    of 16 rows where the kernels running now have panel dots for the type)."""

    def held(t: str) -> str:
        if not host_keeps_blocks(fmt, t):
            return "f32" if t == "F32" else "f32 (at load)"
        if t in GGMLQuantizationType.__members__ and kernels.repacks(int(GGMLQuantizationType[t])):
            return f"the file's blocks, in panels of {PANEL_ROWS} rows"
        return "the file's blocks"

    return {t: held(t) for t in sorted(types)}


def positions(cfg: Any) -> str:
    """How the model knows where a token is, in words: ALiBi, rope with its scaling, or
    nothing at all (no attention layer: a recurrent model reads order from its state)."""
    if all(cfg.layer_shape(i).mixer not in ("attention", "mla") for i in range(cfg.n_layer)):
        return "none (no attention layers)"
    decorations = cfg.decorations()
    if decorations.get("no_rope"):
        return "none (NoPE: the attention layers rotate nothing)"
    if decorations.get("alibi_bias") is not None:
        return f"alibi (max bias {decorations['alibi_bias']:g}, no rope)"
    text = f"rope {cfg.rope_type}, base {cfg.rope_base:g}, {cfg.rope_dim} dims"
    if cfg.rope_scale != 1.0:
        text += f", linear scale {cfg.rope_scale:g}"
    if cfg.has_rope_freqs:
        text += ", per-dimension frequency factors"
    rs = cfg.rope_scaling
    if rs is not None and rs.kind == "attn":
        text += f", attn factor {rs.attn_factor:g}"
    elif rs is not None:
        text += f", {rs.kind} x{rs.factor:g} (original context {rs.orig_ctx})"
    return text


def decoration_values(cfg: Any) -> dict[str, Any]:
    """The decorations that carry a number or a name (a multiplier, a softcap, a clamp),
    by field name; the flag-like ones are listed in "decorations" alone."""
    out = {}
    for name, value in sorted(cfg.decorations().items()):
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out[name] = value
    return out


def describe(path: str | Path, backend: str = "numpy", mem_budget: Budget = None) -> dict[str, Any]:
    """The report of `frink info --json`: architecture, sizes, tensor types, per-layer
    shapes, tokenizer, and which layers `backend` would take (from its own eligibility
    predicate: no device, no weights needed). `backend` is a name from BACKEND_NAMES;
    "auto" reports the host body. mem_budget (GiB, "auto", None: load()'s default):
    "memory" says what would be resident under the budget load() would choose, and where
    the budget came from (a budget load() would refuse is the same FrinkError here)."""
    from .backends import check_backend_name, layer_support
    from .backends.host.rowwise import path as rowwise_path
    from .quant.kernels import kernel_path
    from .tokenizer import load_tokenizer

    check_backend_name(backend)
    ckpt = open_checkpoint(path)
    cfg = config_from_checkpoint(ckpt)
    budget = budget_plan(ckpt, cfg, mem_budget, backend)
    support = layer_support(backend, cfg, ckpt)
    backend_label = "numpy" if backend == "auto" else backend
    tok = load_tokenizer(ckpt)
    facts = checkpoint_facts(ckpt)
    blocks = cfg.ext.info()
    sections = {
        name: blocks.get(name) for name in ("gdn", "mamba", "shortconv", "moe", "mla", "lightning")
    }
    return {
        "path": str(path),
        "format": ckpt.format,
        "architecture": cfg.arch,
        "name": ckpt.metadata.get("general.name"),
        "file_bytes": facts.file_bytes,
        "parameters": facts.n_params,
        "tensor_types": facts.tensor_types,
        "n_layer": cfg.n_layer,
        "n_embd": cfg.n_embd,
        "n_head": cfg.n_head,
        "n_head_kv": cfg.n_head_kv,
        "head_dim": cfg.head_dim_k,
        "n_ff": cfg.n_ff,
        "ffn_act": cfg.ffn_act,
        "n_vocab": cfg.n_vocab,
        "context_length": cfg.n_ctx_train,
        "rope": {"type": cfg.rope_type, "base": cfg.rope_base, "dim": cfg.rope_dim},
        "positions": positions(cfg),
        "sliding_window": cfg.sliding_window,
        "layer_pattern": cfg.layer_pattern(),
        # n_head / n_head_kv / n_ff above are then the largest; "layers" has each one's.
        "per_layer_sizes": cfg.layer_sizes is not None,
        **sections,
        "recurrent_state_bytes": cfg.recurrent_state_bytes(),
        "decorations": sorted(cfg.features()),
        "decoration_values": decoration_values(cfg),
        "tied_embeddings": cfg.tied_embeddings,
        "tokenizer": None if tok is None else _tokenizer_facts(ckpt, tok),
        "chat_template": tok is not None and tok.chat_template is not None,
        "layers": _layer_rows(cfg, support, backend_label, model_traces(cfg, ckpt)),
        "host": {
            "kernels": kernel_path(),
            "rowwise": rowwise_path(),
            "tensor_formats": host_formats(ckpt.format, facts.tensor_types),
        },
        "backend": {
            "name": backend_label,
            "layers_taken": sum(r is None for r in support),
            "tensor_formats": tensor_formats(backend_label, facts.tensor_types, ckpt.format),
        },
        "memory": None if budget is None else budget.describe(),
        "notes": ckpt.notes,
    }


def _layer_rows(
    cfg: ModelConfig, support: list[str | None], backend_label: str, traces: list[list[OpCall]]
) -> list[dict[str, Any]]:
    """Per layer, its shape, whether its composition rotates anything (its trace has a
    rope_: false on a NoPE or ALiBi layer, whatever rope_base the shape carries) and who
    runs it: `backend_label`, or the host with the backend's refusal (support[i], None where
    the backend takes the layer)."""
    layers = []
    for i in range(cfg.n_layer):
        s = cfg.layer_shape(i)
        layers.append(
            {
                "layer": i,
                "mixer": s.mixer,
                "ffn": s.ffn,
                "n_head": s.n_head,
                "n_head_kv": s.n_head_kv,
                "n_ff": s.n_ff,
                "head_dim": s.head_dim_k,
                "kv_source": s.kv_source,
                "window": s.window,
                "chunk": s.chunk,
                "rope_base": s.rope_base,
                "rotates": any(call.op == "rope_" for call in traces[i]),
                "backend": backend_label if support[i] is None else "host",
                "refusal": support[i],
            }
        )
    return layers


def _tokenizer_facts(ckpt: Checkpoint, tok: Tokenizer) -> dict[str, Any]:
    """The report's tokenizer section: its model, vocabulary size and BOS/EOS policy."""
    return {
        "model": ckpt.metadata.get("tokenizer.ggml.model", "tokenizer.json"),
        "n_vocab": tok.n_vocab,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "add_bos": tok.add_bos,
    }


def ledger_summary(backend: Any) -> dict[str, Any] | None:
    """A backend's ledger as data (None on the host body, which has none): device
    submissions by kind, refusals by reason, failures by message."""
    ledger = getattr(backend, "ledger", None)
    if ledger is None:
        return None
    return {
        "submissions": ledger.total(),
        "by_kind": dict(sorted(ledger.submissions.items())),
        "refusals": dict(sorted(ledger.refusals.items())),
        "failures": dict(ledger.failures),
    }


# --- `frink info`'s text ---------------------------------------------------------------------


def print_info(d: dict[str, Any], write: Callable[[str], Any]) -> None:
    """Write `frink info`'s text through `write`: describe()'s data `d`, one fact a line
    (labels padded to 16 columns), then one line per layer and the notes. Text read from the
    file (the model's name, notes) is escaped with errors.printable."""

    def line(label: str, text: str) -> None:
        write(f"{label + ':':<16}{text}\n")

    size = f"{d['file_bytes'] / 1e6:.1f} MB"
    line("model", f"{printable(str(d['name'] or Path(d['path']).name))} ({d['format']}, {size})")
    line("architecture", f"{d['architecture']}, {d['parameters'] / 1e6:.1f}M parameters")
    line("tensor types", ", ".join(f"{k} x{v}" for k, v in sorted(d["tensor_types"].items())))
    line("layers", f"{d['n_layer']} ({d['layer_pattern']})")
    _print_sizes(d, line)
    line("positions", d["positions"])
    values = d["decoration_values"]
    decorations = [
        f"{name} {values[name]:g}" if isinstance(values.get(name), float) else name
        for name in d["decorations"]
    ]
    line("decorations", ", ".join(decorations) or "none")
    _print_mixers(d, line)
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
    mem = d.get("memory")
    if mem is not None:
        where = (
            f"experts in the file, a {mem['expert_cache']} GiB cache of the hot ones"
            if mem["streams_experts"]
            else "every weight resident"
        )
        budget = f"budget {mem['budget']} GiB ({mem['budget_source']})"
        line("memory", f"{budget}: dense {mem['dense']} GiB resident, {where}")
    _print_backends(d, line, write)
    for s in d["layers"]:
        write(_layer_line(d, s))
    for note in d["notes"]:
        write(f"note: {printable(note)}\n")


def _print_sizes(d: dict[str, Any], line: Callable[[str, str], None]) -> None:
    """The embedding and attention lines, or a mamba stack's mixer sizes."""
    moe, mb = d["moe"], d["mamba"]
    # Where every FFN is routed the dense width is unused (or absent): say so instead.
    all_routed = moe and moe["layers"] == d["n_layer"]
    ffn_width = "routed" if all_routed and not moe["parallel_dense"] else d["n_ff"]
    window = f", sliding window {d['sliding_window']}" if d["sliding_window"] else ""
    heads = f"{d['n_head']} heads, {d['n_head_kv']} KV heads, head dim {d['head_dim']}"
    if d["per_layer_sizes"]:  # the largest of each: every layer's own are listed below
        heads = f"up to {heads} (per layer below)"
        ffn_width = f"up to {ffn_width}"
    # A pure mamba stack has no attention, no FFN, no rope: the mixer's sizes instead.
    hybrid = mb and any(s["mixer"] not in ("mamba", "mamba2") for s in d["layers"])
    if mb and not hybrid:
        line("embedding", f"{d['n_embd']}, vocab {d['n_vocab']}")
    else:
        line("embedding", f"{d['n_embd']}, ffn {ffn_width} ({d['ffn_act']}), vocab {d['n_vocab']}")
        line("attention", heads + window)
    if not mb:
        return
    norms = ", RMSNorm on dt/B/C" if mb["dt_b_c_rms"] else ""
    if mb["n_group"]:
        sizes = (
            f"{mb['dt_rank']} heads x {mb['d_inner'] // mb['dt_rank']}, {mb['n_group']} B/C groups"
        )
        label = "mamba2"
    elif mb.get("heads"):  # plamo2's: dt, A and D per head
        heads = mb["heads"]
        sizes, label = f"{heads} heads x {mb['d_inner'] // heads}, dt {mb['dt_rank']}", "mamba"
    else:
        sizes, label = f"dt rank {mb['dt_rank']}", "mamba"
    line(
        label,
        f"inner {mb['d_inner']}, state {mb['d_state']}, {sizes}, conv {mb['conv_kernel']}{norms}",
    )
    _recurrent(d, line, "conv + scan")


def _recurrent(d: dict[str, Any], line: Callable[[str, str], None], what: str) -> None:
    state_kib = d["recurrent_state_bytes"] / 1024
    line("recurrent", f"{state_kib:.1f} KiB state per sequence (f32 {what})")


def _print_mixers(d: dict[str, Any], line: Callable[[str, str], None]) -> None:
    """The gated deltanet, short conv and experts lines, for the models that have them."""
    g, sc, moe = d["gdn"], d["shortconv"], d["moe"]
    if g:
        line(
            "gated deltanet",
            f"{g['layers']} layers, {g['key_heads']} key / {g['value_heads']} value heads"
            f" x {g['head_dim_k']}/{g['head_dim_v']}, conv {g['conv_kernel']},"
            f" value heads {g['value_head_order']}",
        )
        _recurrent(d, line, "conv + delta")
    lc = d.get("lightning")
    if lc:
        line(
            "lightning",
            f"{lc['layers']} layers, {lc['heads']} heads x {lc['head_dim']}, per-head decay,"
            f" residual x {lc['residual_alpha']:g}",
        )
        _recurrent(d, line, "K^T V per head")
    if sc:
        line("short conv", f"{sc['layers']} layers, conv {sc['conv_kernel']} over {d['n_embd']}")
        _recurrent(d, line, "conv tail")
    if moe:
        shared = f", shared expert ffn {moe['shared_ff']}" if moe["shared_ff"] else ""
        gating = ""
        if moe["gating"] != "softmax" or moe["expert_bias"]:
            gating = f", {moe['gating']} router" + (" + expert bias" if moe["expert_bias"] else "")
        if moe.get("weights_before"):
            gating += ", weights on the expert inputs"
        groups = ""
        if moe.get("groups", 1) > 1:
            groups = f", top {moe['groups_used']} of {moe['groups']} expert groups"
        line(
            "experts",
            f"{moe['experts']}, top {moe['experts_used']}, expert ffn {moe['expert_ff']}"
            f"{shared}{gating}{groups}",
        )
    if d["mla"]:
        _print_mla(d["mla"], line)


def _print_mla(a: dict[str, Any], line: Callable[[str, str], None]) -> None:
    """Multi-head latent attention's sizes and what its cache holds per token."""
    q = f"q_lora {a['q_lora_rank']}" if a["q_lora_rank"] else "plain wq"
    line(
        "latent attn",
        f"kv_lora {a['kv_lora_rank']}, {q}, head dims nope {a['head_dim_nope']} + rope "
        f"{a['rope_dim']}, v {a['head_dim_v']}",
    )
    line(
        "cache",
        f"{a['cache']}: {a['cache_floats_per_token']} floats per token per layer "
        f"(full K/V: {a['full_kv_floats_per_token']})",
    )


def _print_backends(
    d: dict[str, Any], line: Callable[[str, str], None], write: Callable[[str], Any]
) -> None:
    """The host's kernels and tensor formats, and the chosen backend's share of the layers."""
    host = d["host"]
    line("host kernels", host["kernels"])
    line("host rowwise", host["rowwise"])
    for dtype, how in host["tensor_formats"].items():
        write(f"  {dtype:<6} -> {how}\n")
    be = d["backend"]["name"]
    if be != "numpy":
        taken = d["backend"]["layers_taken"]
        rest = "(prefill and decode; the host body runs the rest)"
        line("backend", f"{be} takes {taken} of {d['n_layer']} layers {rest}")
        for dtype, how in d["backend"]["tensor_formats"].items():
            write(f"  {dtype:<6} -> {how}\n")


def _layer_line(d: dict[str, Any], s: dict[str, Any]) -> str:
    """One layer's line: its mixer, its FFN and, under a device backend, where it runs."""
    be, moe = d["backend"]["name"], d["moe"]
    where = ""
    if be != "numpy":
        where = f"  [{be}]" if s["refusal"] is None else f"  [host ({s['refusal']})]"
    if s["ffn"] == "moe":
        ffn = f"moe ffn {moe['experts']}x{moe['expert_ff']}"
    elif s["ffn"] == "dense+moe":
        ffn = f"dense ffn {s['n_ff']} + moe ffn {moe['experts']}x{moe['expert_ff']}"
    elif s["ffn"] == "none":
        ffn = "no ffn"
    else:
        ffn = f"{s['ffn']} ffn {s['n_ff']}"
    return f"  blk.{s['layer']:<3} {_mixer_text(d, s)} + {ffn}{where}\n"


def _mixer_text(d: dict[str, Any], s: dict[str, Any]) -> str:
    """A layer's mixer as `frink info` names it, with its sizes."""
    g, mb, sc = d["gdn"], d["mamba"], d["shortconv"]
    mixer = s["mixer"]
    if mixer == "gdn":
        return f"gdn ({g['key_heads']}k/{g['value_heads']}v x {g['head_dim_k']})"
    if mixer == "mamba":
        return f"mamba ({mb['d_inner']} x {mb['d_state']})"
    if mixer == "shortconv":
        return f"shortconv (conv {sc['conv_kernel']})"
    if mixer == "mamba2":
        return f"mamba2 ({mb['dt_rank']} heads, {mb['d_inner']} x {mb['d_state']})"
    if mixer == "lightning":
        lc = d["lightning"]
        return f"lightning ({lc['heads']} heads x {lc['head_dim']}, recurrent state)"
    if mixer == "none":
        return "no attention"
    if mixer == "linear":
        return f"linear (wo only, {s['n_head']}q)"
    win = f" window {s['window']}" if s["window"] else ""
    if s.get("chunk"):  # chunked local attention (its cache keeps the current chunk)
        win += f" chunk {s['chunk']}"
    # The layer's own head counts (they differ per layer in openelm and deci).
    shape = f"{s['n_head']}q/{s['n_head_kv']}kv x {s['head_dim']}"
    if s.get("kv_source") is not None:  # gemma4's KV sharing
        shape += f", K/V of blk.{s['kv_source']}"
    if s["rotates"]:
        where_pos = f"rope {s['rope_base']:g}"
    else:
        where_pos = "alibi" if d["positions"].startswith("alibi") else "no rope"
    return f"{mixer} ({shape}, {where_pos}{win})"
