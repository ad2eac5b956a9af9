"""What Ollama's model routes say about the one model a `frink serve` holds: /api/tags
(list), /api/show, /api/ps, each in Ollama's shape, read from the checkpoint's headers
once.

- `digest` identifies the file (sha256 of its path, size and modification time), not its
  bytes: hashing a multi-gigabyte file to answer a listing would stall it;
- `quantization_level` is the stored type holding the most weights; `parameter_size`
  counts every tensor's elements;
- /api/ps reports the model as loaded until the server stops (`expires_at` far ahead,
  as Ollama shows a model kept with keep_alive -1), with the server's context length.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..channels import is_harmony

NEVER = "9999-12-31T23:59:59Z"
_MAX_INFO_TEXT = 1000  # longer metadata strings (a chat template, say) are left out


@dataclass(frozen=True)
class ModelFacts:
    name: str
    size: int  # the file's bytes (a safetensors directory's *.safetensors files)
    modified_at: str
    digest: str
    details: dict
    model_info: dict  # the checkpoint's scalar metadata
    capabilities: list[str]
    template: str


def model_facts(model: Any, name: str) -> ModelFacts:
    """The facts of `model` (api.Model) served as `name`, from its checkpoint's headers."""
    ckpt = model.checkpoint
    path = Path(ckpt.path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    stats = [f.stat() for f in files]
    size = sum(s.st_size for s in stats)
    mtime = max((s.st_mtime_ns for s in stats), default=0)
    weights: Counter[str] = Counter()
    for n in ckpt.tensors.names():
        info = ckpt.tensors.info(n)
        weights[str(info.dtype)] += math.prod(info.shape)
    details = {
        "parent_model": "",
        "format": ckpt.format,
        "family": ckpt.arch,
        "families": [ckpt.arch],
        "parameter_size": _count(sum(weights.values())),
        "quantization_level": weights.most_common(1)[0][0] if weights else "",
    }
    info = {
        k: v
        for k, v in ckpt.metadata.items()
        if isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= _MAX_INFO_TEXT)
    }
    tok = model.tokenizer
    # Ollama's names: an encoder only embeds; a decoder also embeds (its pooled rows).
    if model.config.ext.embeds_only():
        capabilities = ["embedding"]
    else:
        capabilities = ["completion", "tools", "embedding"]
    if tok is not None and is_harmony(tok):
        capabilities.append("thinking")
    return ModelFacts(
        name=name,
        size=size,
        modified_at=_iso(mtime / 1e9),
        digest=hashlib.sha256(f"{path}:{size}:{mtime}".encode()).hexdigest(),
        details=details,
        model_info=info,
        capabilities=capabilities,
        template=(tok.chat_template or "") if tok is not None else "",
    )


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def now() -> str:
    """The current time as Ollama writes `created_at` (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _entry(f: ModelFacts) -> dict:
    return {"name": f.name, "model": f.name, "size": f.size, "digest": f.digest}


def tags(f: ModelFacts) -> dict:
    """/api/tags: the models this server has."""
    return {"models": [{**_entry(f), "modified_at": f.modified_at, "details": f.details}]}


def show(f: ModelFacts) -> dict:
    """/api/show: the model's details, metadata, template and capabilities."""
    return {
        "license": "",
        "modelfile": "",
        "parameters": "",
        "template": f.template,
        "details": f.details,
        "model_info": f.model_info,
        "capabilities": f.capabilities,
        "modified_at": f.modified_at,
    }


def running(f: ModelFacts, n_ctx: int) -> dict:
    """/api/ps: the models loaded (this server's one, for as long as it runs)."""
    entry = {**_entry(f), "details": f.details, "expires_at": NEVER, "size_vram": 0}
    return {"models": [{**entry, "context_length": n_ctx}]}
