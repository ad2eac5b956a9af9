"""`frink embed MODEL TEXT...`: each text's embedding on stdout, one line of numbers per
text, or (--json) one object in the shape of OpenAI's embeddings response.

Its imports stay light (the api's are taken when the command runs): `frink --help` stays
quick.
"""

from __future__ import annotations

import json
import sys

import typer

from .cli_exit import verbose_flag

POOLING_OPTION = typer.Option(
    None,
    "--pooling",
    help="pool embeddings by mean|cls|last (default: as the model says; llama-server's flag)",
)


@verbose_flag
def embed(
    model: str = typer.Argument(
        ..., help="GGUF file, HF / sentence-transformers directory or model name"
    ),
    texts: list[str] = typer.Argument(..., help="the texts to embed"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object (OpenAI's shape)"),
    truncate: bool = typer.Option(
        False, "--truncate", help="cut inputs longer than the model takes (else refused)"
    ),
    pooling: str | None = POOLING_OPTION,
    verbose: bool = False,
) -> None:
    """Embed texts: pooled as the model folder says (sentence-transformers modules.json,
    a GGUF's pooling_type) unless --pooling says otherwise."""
    from .api import load
    from .embedding import check_pooling, with_pooling
    from .pull import resolve_model_arg

    check_pooling(pooling)
    path = resolve_model_arg(model)
    m = load(path)
    m.embed_plan = with_pooling(m.embed_plan, pooling)
    vectors = m.embed(texts, truncate=truncate)
    if as_json:
        data = [
            {"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(vectors)
        ]
        out = {"object": "list", "model": path.name, "data": data}
        sys.stdout.write(json.dumps(out) + "\n")
        return
    for v in vectors:
        sys.stdout.write(" ".join(f"{x:.8g}" for x in v.tolist()) + "\n")
