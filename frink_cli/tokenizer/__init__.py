"""Text <-> token ids, exactly as llama.cpp does it for the same file.

Why this package exists: a model only reproduces its reference outputs when it sees the
reference's token ids, so tokenization is matched to llama.cpp (llama-vocab.cpp) id for id,
quirks included, and tested against llama-cpp-python rather than against itself.

Two sources, one `Tokenizer`:

* GGUF metadata (`tokenizer.ggml.*`). Token attributes, end-of-generation ids and the
  special-token split follow llama-vocab.cpp's loader. The text between special tokens is
  encoded by
  - "gpt2" byte-level BPE: a `tokenizers` BPE model built in memory from the file's vocab
    and merges, behind the pre-tokenizer regexes llama.cpp uses for `tokenizer.ggml.pre`
    (each regex a Split with "isolated" behaviour, as unicode_regex_split keeps both the
    matches and the text between them);
  - "gemma4" (or pre-tokenizer "gemma4") SentencePiece-style BPE: spaces written as "▁",
    the same `tokenizers` BPE on raw UTF-8 with <0xXX> byte fallback, run per line and per
    newline run as llama.cpp's gemma4 pre-tokenizer does;
  - "llama" SentencePiece: a port of llm_tokenizer_spm (score-driven bigram merges, byte
    fallback). `tokenizers` cannot express it exactly (its BPE merges are ranked pairs, not
    "any two neighbours whose concatenation is a token, best score first"), and a faithful
    merge list for a 262k vocab is large and slow to build, so it is plain Python.
* A Hugging Face directory: tokenizer.json through `tokenizers`, which is the reference
  implementation for those files; BOS/EOS policy and the chat template from
  tokenizer_config.json (and chat_template.jinja/.json), extra EOS ids from
  config.json / generation_config.json.

Detokenization matches llama-cpp-python's `Llama.detokenize(ids)` (special=False): each
token's piece from llama_token_to_piece, control and unknown tokens rendered as nothing,
user-defined tokens as their text, and one leading space dropped when the ids start with
BOS. No clean-up of spaces (llama_detokenize's clean_spaces is not applied there).

The package: core.py (the `Tokenizer` and what a vocabulary source provides), gguf.py
(reading tokenizer.ggml.* metadata) with gguf_vocab.py and spm.py (the GGUF vocabularies'
encoding), pretokenizers.py (the regex splits per tokenizer.ggml.pre name), special.py
(end-of-generation and control tokens, for both sources), byte_level.py, and hf.py (a
Hugging Face directory through `tokenizers`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .core import StreamDecoder, Tokenizer
from .gguf import load_gguf
from .hf import load_hf

if TYPE_CHECKING:
    from ..formats import Checkpoint

__all__ = ["StreamDecoder", "Tokenizer", "load_tokenizer"]


def load_tokenizer(ckpt: Checkpoint) -> Tokenizer | None:
    """The checkpoint's tokenizer, or None when the file carries none.

    A Hugging Face directory is read from its tokenizer files; otherwise the GGUF
    metadata is used (tokenizer.ggml.model "none" or absent means no tokenizer).
    """
    if ckpt.hf_dir is not None:
        return load_hf(Path(ckpt.hf_dir))
    return load_gguf(ckpt)
