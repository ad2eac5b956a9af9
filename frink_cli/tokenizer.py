"""Text <-> token ids, exactly as llama.cpp does it for the same file.

Why this module exists: a model only reproduces its reference outputs when it sees the
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
"""

from __future__ import annotations

import codecs
import json
import re
import threading
from collections.abc import Iterable, Sequence
from heapq import heappop, heappush
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .errors import FrinkError
from .formats.jsonfile import read_json, read_model_file

if TYPE_CHECKING:
    from .formats import Checkpoint

# llama_token_attr bits (llama.h)
_A_UNKNOWN = 1 << 0
_A_UNUSED = 1 << 1
_A_NORMAL = 1 << 2
_A_CONTROL = 1 << 3
_A_USER_DEFINED = 1 << 4
_A_BYTE = 1 << 5
_A_LSTRIP = 1 << 7
_A_RSTRIP = 1 << 8

# llama_token_type (tokenizer.ggml.token_type) -> attribute; anything else is UNDEFINED (0).
_TYPE_TO_ATTR = {
    1: _A_NORMAL,
    2: _A_UNKNOWN,
    3: _A_CONTROL,
    4: _A_USER_DEFINED,
    5: _A_UNUSED,
    6: _A_BYTE,
}

# Tokens llama.cpp treats as end-of-generation by their text (llama-vocab.cpp, "maintain a
# list of tokens that cause end-of-generation"). Text-based because converters do not
# record which tokens end a turn.
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<｜end▁of▁sentence｜>",
        "[e~[",
    }
)
# FIM tokens found by text when the file does not name them; llama.cpp makes them control
# tokens, and the pad/repo/file-separator ones end generation.
_FIM_TEXTS = {
    "pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}
_EOG_FIM = ("pad", "rep", "sep")
_EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)

# --- pre-tokenizer regexes, by tokenizer.ggml.pre (llm_tokenizer_bpe's constructor) --------
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    + _CONTRACTIONS
    + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
_DEEPSEEK3 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    (
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
]

_DEEPSEEK_LLM_LETTERS = (  # written as escapes: NFC would fold several of these
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
    "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-"
    "\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00"
    "-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
    "\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-"
    "\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13"
    "-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)

_PRE_REGEXES: dict[str, list[str]] = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "llama3": [_LLAMA3],
    "dbrx": [_LLAMA3],
    "chatglm4": [_LLAMA3],
    "jais2": [
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
        r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
    ],
    "deepseek-llm": [
        r"[\r\n]",
        r"\s?[" + _DEEPSEEK_LLM_LETTERS + "]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        # std::regex's `$` is end of input only; Oniguruma's would also match before "\n".
        r"\s+\z",
        r"[一-龥ࠀ-一가-퟿]+",
        r"\p{N}+",
    ],
    "deepseek3": _DEEPSEEK3,
    "spark2_5": [
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        (
            r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
            r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"
        ),
        r"\p{N}",
    ],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"],
    "starcoder": [r"\p{N}", _GPT2],
    "gpt2": [_GPT2],
    "qwen2": [_QWEN2],
    "qwen35": [_QWEN35],
    "bloom": [_BLOOM],
    "viking": [_BLOOM, r"\p{N}"],
    "tekken": [
        (
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?"
            r"((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+"
        )
    ],
    "chameleon": [
        r"<sentinel:[0-9]+>",
        r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        r"([\t\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        _GPT2,
    ],
    "gpt4o": [_GPT4O],
    "bailingmoe": [
        (
            r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
        )
    ],
    "seed-coder": [
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    "ufakzeka": [
        (
            r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
            r"|\s+(?!\S)|\s+"
        )
    ],
    "grok-2": [_QWEN2],
    "laguna": [r"[^\n]+|[\n]+", _QWEN2],
    "exaone-moe": [
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"
    ],
    "minicpm5": [
        r"\p{N}{1,3}",
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
}

# tokenizer.ggml.pre name -> (regex family, flags it sets in llama.cpp's loader).
# clean_spaces only matters to llama_detokenize, which frink does not mirror (see module doc).
_PRE_NAMES: dict[str, tuple[str, dict[str, bool]]] = {}


def _pre(family: str, names: Iterable[str], **flags: bool) -> None:
    for n in names:
        _PRE_NAMES[n] = (family, flags)


_pre("default", ["default"])
_pre("minicpm5", ["minicpm5"], ignore_merges=True)
_pre(
    "llama3",
    [
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "jina-v5-nano",
    ],
    ignore_merges=True,
    add_bos=True,
)
_pre("deepseek-llm", ["deepseek-llm"])
_pre("deepseek-coder", ["deepseek-coder"])
_pre("deepseek3", ["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"])
_pre("spark2_5", ["spark2_5"])
_pre("falcon", ["falcon"])
_pre(
    "gpt2",
    [
        "mpt",
        "gpt-2",
        "phi-2",
        "jina-es",
        "jina-de",
        "gigachat",
        "jina-v2-es",
        "jina-v2-de",
        "a.x-4.0",
        "mellum",
        "modern-bert",
        "jina-v1-en",
        "jina-v2-code",
        "roberta-bpe",
        "olmo",
        "jais",
        "exaone4",
        "trillion",
        "granite-docling",
    ],
)
_pre(
    "starcoder",
    ["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"],
)
_pre("jais2", ["jais-2"])
_pre(
    "qwen2",
    [
        "qwen2",
        "deepseek-r1-qwen",
        "kormo",
        "f2llmv2",
        "stablelm2",
        "megrez",
        "hunyuan",
        "solar-open",
    ],
)
_pre("qwen35", ["qwen35"])
_pre("llama3", ["dbrx", "smaug-bpe"])
_pre("bloom", ["poro-chat", "bloom", "gpt3-finnish"])
_pre("chatglm4", ["chatglm-bpe"], no_bos=True)
_pre("chatglm4", ["glm4", "glm5"], no_bos=True, ignore_merges=True)
_pre("viking", ["viking"])
_pre("tekken", ["tekken"], ignore_merges=True, add_bos=True)
_pre("chameleon", ["chameleon"], add_bos=True)
_pre("gpt4o", ["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"])
_pre("bailingmoe", ["bailingmoe", "bailingmoe2", "llada-moe"])
_pre("seed-coder", ["seed-coder"])
_pre("ufakzeka", ["ufakzeka"])
_pre("grok-2", ["grok-2"])
_pre("laguna", ["laguna"])
_pre("exaone-moe", ["exaone-moe"])
# SentencePiece-style BPE (Gemma 4): spaces written as "▁", raw UTF-8 with <0xXX> byte
# fallback, split only into lines and newline runs; llama.cpp forces BOS on for it.
_pre("gemma4", ["gemma4", "granite-embed-multi-311m"], force_bos=True, escape_whitespace=True)
# Pre-tokenizers llama.cpp implements with hand-written splitters (kimi-k2, afmoe, tiny_aya,
# superbpe) or that encode spaces SentencePiece-style inside BPE without gemma4's exact
# rules (sarvam-moe, whitespace): frink refuses them rather than tokenizing differently.
_PRE_UNSUPPORTED = {
    "kimi-k2",
    "afmoe",
    "tiny_aya",
    "cohere2moe",
    "superbpe",
    "granite-embed-multi-97m",
    "sarvam-moe",
    "whitespace",
    "jina-v2-zh",
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies store)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_BYTE_TO_CHAR = _bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}
_HEX_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_LINES_OR_NEWLINES = re.compile(r"[^\n]+|\n+")  # the gemma4 pre-tokenizer's one split
_ISSPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale, what llama.cpp's lstrip/rstrip use


def _byte_level_decode(text: str) -> bytes:
    """llama_decode_text: byte-level characters back to bytes, oddities spelled out."""
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in text)
    except KeyError:
        pass
    out = bytearray()
    for c in text:
        b = _CHAR_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
        else:  # llama.cpp writes this marker for a character outside the byte table
            out += (
                "[UNK_BYTE_0x" + c.encode("utf-8", "surrogateescape").hex() + text + "]"
            ).encode("utf-8", "surrogateescape")
    return bytes(out)


class StreamDecoder:
    """Turns generated ids into text as they arrive, never splitting a UTF-8 character.

    A token may end in the middle of a multi-byte character (byte-fallback and byte-level
    BPE tokens do); its bytes are held until the character is complete. Invalid sequences
    come out as U+FFFD, as a final decode would.
    """

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class Tokenizer:
    """One model's vocabulary: encode, decode, BOS/EOS policy and end-of-generation ids."""

    def __init__(
        self,
        core: _Core,
        *,
        bos_id: int | None,
        eos_id: int | None,
        eog_ids: Iterable[int],
        add_bos: bool,
        add_eos: bool,
        chat_template: str | None,
        source: str,
    ) -> None:
        self._core = core
        self.n_vocab: int = core.n_vocab
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eog_ids: frozenset[int] = frozenset(eog_ids)
        self.add_bos = bool(add_bos) and bos_id is not None
        self.add_eos = bool(add_eos) and eos_id is not None
        self.chat_template = chat_template
        self.bos_text: str | None = core.token_text(bos_id) if bos_id is not None else None
        self.eos_text: str | None = core.token_text(eos_id) if eos_id is not None else None
        self.source = source  # "gguf" | "hf", for notes and error messages
        self._max_token_chars: int | None = None
        self._control_texts: tuple[str, ...] | None = None

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids for `text`, as llama_tokenize(text, add_special, parse_special).

        One deliberate difference: when the text itself starts with the BOS token (written
        as text and parsed), BOS is not added a second time (nor EOS when it already ends
        with EOS). llama_tokenize would add it and warn; llama.cpp's chat path avoids the
        double BOS by stripping the BOS text first, and that is what every caller here wants.
        """
        ids = self._core.encode_text(text, parse_special)
        if add_special:
            bos, eos = self.bos_id, self.eos_id  # never None where add_bos / add_eos is set
            if self.add_bos and bos is not None and not (ids and ids[0] == bos):
                ids.insert(0, bos)
            if self.add_eos and eos is not None and not (ids and ids[-1] == eos):
                ids.append(eos)
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token contributes to text (b"" for control tokens)."""
        if not 0 <= token_id < self.n_vocab:
            raise FrinkError(
                f"token id {token_id} is outside the vocabulary (0..{self.n_vocab - 1})"
            )
        return self._core.piece(token_id)

    def decode(self, ids: Sequence[int]) -> str:
        """Text for `ids`, as llama-cpp-python's Llama.detokenize(ids) decoded as UTF-8."""
        out = b"".join(self.token_bytes(int(i)) for i in ids)
        # llama-cpp-python drops one leading space after BOS (the SentencePiece word prefix).
        if len(ids) and self.bos_id is not None and ids[0] == self.bos_id and out[:1] == b" ":
            out = out[1:]
        return out.decode("utf-8", errors="replace")

    @property
    def max_token_chars(self) -> int:
        """The longest token's text in characters: n tokens spell at most n times this, so a
        text longer than that is refused untokenized (chat.prompt_ids)."""
        if self._max_token_chars is None:
            self._max_token_chars = self._core.max_token_chars()
        return self._max_token_chars

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self)

    def token_text(self, token_id: int) -> str:
        """The token as the vocabulary spells it (e.g. "Ġthe", "▁the", "<|im_end|>")."""
        return self._core.token_text(token_id)

    def token_id(self, text: str) -> int | None:
        """The id of the vocabulary entry spelled exactly `text`, if there is one."""
        return self._core.token_id(text)

    @property
    def control_texts(self) -> tuple[str, ...]:
        """The spellings that encode(parse_special=True) reads as control tokens and
        parse_special=False as plain text, longest first."""
        if self._control_texts is None:
            texts = {t for t in self._core.control_texts() if t}
            self._control_texts = tuple(sorted(texts, key=lambda t: (-len(t), t)))
        return self._control_texts


class _Core(Protocol):
    """What a vocabulary source provides: the text between BOS/EOS, and pieces."""

    n_vocab: int

    def encode_text(self, text: str, parse_special: bool) -> list[int]: ...

    def piece(self, token_id: int) -> bytes: ...

    def token_text(self, token_id: int) -> str: ...

    def token_id(self, text: str) -> int | None: ...

    def max_token_chars(self) -> int: ...

    def control_texts(self) -> list[str]: ...


# ---------------------------------------------------------------------------------------
# GGUF vocabularies
# ---------------------------------------------------------------------------------------


def _as_list(value: Any) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


class _GgufCore(_Core):
    def __init__(
        self,
        tokens: list[str],
        to_id: dict[str, int],
        attrs: list[int],
        scores: list[float] | None,
        kind: str,
        add_space_prefix: bool,
        unk_id: int | None,
        bpe: Any | None,
        escape_whitespace: bool = False,
    ) -> None:
        self.tokens = tokens
        self.attrs = attrs
        self.scores = scores
        self.kind = kind  # "spm" | "bpe"
        self.add_space_prefix = add_space_prefix
        self.unk_id = unk_id
        self.n_vocab = len(tokens)
        self.to_id = to_id
        self._bpe = bpe  # tokenizers.Tokenizer for "bpe"
        # llama.cpp's escape_whitespaces for BPE: spaces are "▁" in tokens (Gemma 4)
        self.escape_whitespace = escape_whitespace
        self._pieces: dict[int, bytes] = {}
        # tokenizer_st_partition's order: control, user-defined and unknown tokens, longest
        # (in bytes) first. std::sort leaves equal lengths in no defined order; id order here.
        mask = _A_CONTROL | _A_USER_DEFINED | _A_UNKNOWN
        special = [i for i, a in enumerate(attrs) if a & mask]
        special.sort(key=lambda i: -len(tokens[i].encode("utf-8", "surrogateescape")))
        self.special = [(tokens[i], i, attrs[i]) for i in special]

    # -- encoding ---------------------------------------------------------------------
    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split out special tokens written as text (tokenizer_st_partition)."""
        frags: list[str | int] = [text]
        for stext, sid, attr in self.special:
            if not parse_special and attr & (_A_CONTROL | _A_UNKNOWN):
                continue  # user-defined tokens are split out even without parse_special
            if stext not in text:
                continue  # cannot be in any fragment either: fragments are substrings
            out: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or stext not in frag:
                    out.append(frag)
                    continue
                start = 0
                while True:
                    m = frag.find(stext, start)
                    if m < 0:
                        break
                    left = frag[start:m]
                    if attr & _A_LSTRIP:
                        left = left.rstrip(_ISSPACE)
                    if left:
                        out.append(left)
                    out.append(sid)
                    start = m + len(stext)
                    if attr & _A_RSTRIP:
                        while start < len(frag) and frag[start] in _ISSPACE:
                            start += 1
                rest = frag[start:]
                if rest:
                    out.append(rest)
            frags = out
        return frags

    def encode_text(self, text: str, parse_special: bool) -> list[int]:
        if not text:
            return []
        ids: list[int] = []
        prev_special = True  # SPM: a word prefix space at the start and after special tokens
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                ids.append(frag)
                prev_special = True
                continue
            if self.kind == "spm":
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._spm(frag.replace(" ", "\u2581"), ids)
            else:
                assert self._bpe is not None  # _load_gguf builds one for every "bpe" vocabulary
                if self.escape_whitespace:
                    self._spm_style_bpe(frag.replace(" ", "\u2581"), ids)
                else:
                    ids.extend(self._bpe.encode(frag, add_special_tokens=False).ids)
            prev_special = False
        return ids

    def _spm_style_bpe(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_bpe_session for the gemma4 pre-tokenizer: BPE over each line and each
        newline run ("[^\\n]+|[\\n]+"), except that a newline run which is itself a token is
        taken whole (llama.cpp's Gemma 4 fix: its multi-newline tokens have no merge path)."""
        assert self._bpe is not None
        for word in _LINES_OR_NEWLINES.findall(text):
            tid = self.to_id.get(word) if word[0] == "\n" else None
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._bpe.encode(word, add_special_tokens=False).ids)

    def _spm(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session::tokenize: best-scoring neighbour merges, then bytes."""
        n = len(text)
        if n == 0:
            return
        to_id, scores = self.to_id, self.scores
        assert scores is not None  # every "spm" vocabulary has scores (0.0 when none stored)
        start = list(range(n))  # symbol i covers text[start[i] : start[i] + size[i]]
        size = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, int, int]] = []

        def try_add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            s = start[left]
            tid = to_id.get(text[s : s + size[left] + size[right]])
            if tid is None:
                return
            # max-heap on score, ties to the leftmost pair (llm_bigram_spm::comparator)
            heappush(heap, (-scores[tid], left, right, size[left] + size[right]))

        for i in range(1, n):
            try_add(i - 1, i)
        while heap:
            _, left, right, sz = heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != sz:
                continue  # one side was merged away since this pair was queued
            size[left] = sz
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])
        i = 0
        while i != -1:
            piece = text[start[i] : start[i] + size[i]]
            tid = to_id.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                # A symbol that is no token is a single character: its UTF-8 bytes as
                # <0xXX> tokens (or bare one-byte tokens), as llama_vocab::byte_to_token.
                for b in piece.encode("utf-8", "surrogateescape"):
                    bid = to_id.get(f"<0x{b:02X}>")
                    if bid is None:
                        bid = to_id.get(chr(b)) if b < 0x80 else None
                    if bid is None:
                        # llama.cpp aborts here (the vocab has no byte tokens); unk is the
                        # only sensible id left.
                        if self.unk_id is None:
                            raise FrinkError(
                                f"vocabulary has no byte token for 0x{b:02X} and no unknown token"
                            )
                        bid = self.unk_id
                    out.append(bid)
            i = nxt[i]

    # -- decoding ---------------------------------------------------------------------
    def piece(self, token_id: int) -> bytes:
        """llama_token_to_piece(token, special=False)."""
        p = self._pieces.get(token_id)
        if p is not None:
            return p
        attr = self.attrs[token_id]
        text = self.tokens[token_id]
        if attr & (_A_UNKNOWN | _A_CONTROL):
            p = b""
        elif attr & _A_USER_DEFINED:
            p = text.encode("utf-8", "surrogateescape")
        elif attr & _A_NORMAL:
            if self.kind == "spm" or self.escape_whitespace:
                p = text.replace("\u2581", " ").encode("utf-8", "surrogateescape")
            else:
                p = _byte_level_decode(text)
        elif attr & _A_BYTE:
            m = _HEX_BYTE.fullmatch(text)
            p = bytes([int(m.group(1), 16)]) if m else b""
        else:  # unused / undefined
            p = b""
        self._pieces[token_id] = p
        return p

    def token_text(self, token_id: int) -> str:
        return self.tokens[token_id]

    def max_token_chars(self) -> int:
        return max(map(len, self.tokens), default=1)

    def control_texts(self) -> list[str]:
        return [t for t, _, attr in self.special if attr & (_A_CONTROL | _A_UNKNOWN)]

    def token_id(self, text: str) -> int | None:
        return self.to_id.get(text)


def _build_bpe(
    to_id: dict[str, int],
    merges_raw: list[str],
    regexes: list[str] | None,
    ignore_merges: bool,
    notes: list[str],
) -> Any:
    """A `tokenizers` BPE over the GGUF vocab: Split(regex, isolated)* + ByteLevel bytes, or
    with `regexes` None a bare BPE on raw UTF-8 with <0xXX> byte fallback, fed one word at a
    time (the SentencePiece-style vocabularies, _GgufCore._spm_style_bpe)."""
    from tokenizers import Regex, models, pre_tokenizers
    from tokenizers import Tokenizer as HfTokenizer

    merges: list[tuple[str, str]] = []
    dropped = 0
    for m in merges_raw:
        # llama.cpp splits at the first space after position 0 (a merge may start with " ")
        pos = m.find(" ", 1)
        if pos < 0:
            dropped += 1
            continue
        a, b = m[:pos], m[pos + 1 :]
        # `tokenizers` requires both halves and the result to be tokens; llama.cpp would still
        # merge and then spell the unknown result byte by byte.
        if a in to_id and b in to_id and a + b in to_id:
            merges.append((a, b))
        else:
            dropped += 1
    if dropped:
        notes.append(
            f"tokenizer: {dropped} BPE merges name tokens missing from the vocabulary "
            "and were dropped"
        )
    if regexes is None:
        return HfTokenizer(
            models.BPE(
                vocab=dict(to_id), merges=merges, ignore_merges=ignore_merges, byte_fallback=True
            )
        )
    model = models.BPE(vocab=dict(to_id), merges=merges, ignore_merges=ignore_merges)
    tk = HfTokenizer(model)
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return tk


def _load_gguf(ckpt: Checkpoint) -> Tokenizer | None:
    md = ckpt.metadata
    model = md.get("tokenizer.ggml.model")
    if model is None or model in ("none", "no_vocab"):
        return None
    where = str(ckpt.path)
    if model not in ("gpt2", "llama", "gemma4"):
        raise FrinkError(
            f"{where}: tokenizer model '{model}' is not supported (frink reads "
            "'gpt2' byte-level BPE, 'gemma4' SentencePiece-style BPE and 'llama' "
            "SentencePiece vocabularies)"
        )
    if "tokenizer.ggml.tokens" not in md:
        raise FrinkError(f"{where}: GGUF has no tokenizer.ggml.tokens")
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(md["tokenizer.ggml.tokens"])]
    n = len(tokens)
    kind = "spm" if model == "llama" else "bpe"

    # llama_vocab::impl::load defaults per tokenizer model
    if kind == "spm":
        ids: dict[str, int | None] = {"bos": 1, "eos": 2, "unk": 0}
        add_bos, add_space_prefix = True, True
    elif model == "gemma4":  # no default ids; the pre-tokenizer is "gemma4" whatever is stored
        ids = {"bos": None, "eos": None, "unk": None}
        add_bos, add_space_prefix = False, False
    else:
        ids = {"bos": 11, "eos": 11, "unk": None}
        add_bos, add_space_prefix = False, False
    add_eos = False
    ids.update({k: None for k in ("eot", "eom", "pre", "suf", "mid", "pad", "rep", "sep")})

    pre_family, ignore_merges = "default", False
    flags: dict[str, bool] = {}
    if kind == "bpe":
        pre = "gemma4" if model == "gemma4" else md.get("tokenizer.ggml.pre") or ""
        if not pre:
            ckpt.notes.append(
                "tokenizer: GGUF has no tokenizer.ggml.pre; using llama.cpp's "
                "'default' pre-tokenizer (generation quality may suffer)"
            )
            pre_family, flags = "default", {}
        elif pre in _PRE_UNSUPPORTED:
            raise FrinkError(f"{where}: pre-tokenizer '{pre}' is not supported by frink")
        elif pre in _PRE_NAMES:
            pre_family, flags = _PRE_NAMES[pre]
        else:  # llama.cpp refuses unknown names too, rather than tokenizing differently
            raise FrinkError(f"{where}: unknown pre-tokenizer type '{pre}' (tokenizer.ggml.pre)")
        ignore_merges = flags.get("ignore_merges", False)
        add_bos = flags.get("add_bos", add_bos)
        if flags.get("no_bos"):
            ids["bos"] = None
    if "tokenizer.ggml.add_space_prefix" in md:
        add_space_prefix = bool(md["tokenizer.ggml.add_space_prefix"])

    for k, v in ids.items():  # a default out of range is disabled
        if v is not None and v >= n:
            ids[k] = None
    for k, key in (
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("eot", "eot_token_id"),
        ("eom", "eom_token_id"),
        ("unk", "unknown_token_id"),
        ("pre", "fim_pre_token_id"),
        ("suf", "fim_suf_token_id"),
        ("mid", "fim_mid_token_id"),
        ("pad", "fim_pad_token_id"),
        ("rep", "fim_rep_token_id"),
        ("sep", "fim_sep_token_id"),
        ("pre", "prefix_token_id"),
        ("suf", "suffix_token_id"),
        ("mid", "middle_token_id"),
    ):
        v = md.get("tokenizer.ggml." + key)
        if v is not None and 0 <= int(v) < n:
            ids[k] = int(v)
    if "tokenizer.ggml.add_bos_token" in md:
        add_bos = bool(md["tokenizer.ggml.add_bos_token"])
    if "tokenizer.ggml.add_eos_token" in md:
        add_eos = bool(md["tokenizer.ggml.add_eos_token"])
    if flags.get("force_bos"):  # llama.cpp's Gemma 4 workaround overrides the file's flag
        add_bos = True

    ttypes = md.get("tokenizer.ggml.token_type")
    if ttypes is None:
        attrs = [_A_NORMAL] * n
    else:
        ttypes = _as_list(ttypes)
        attrs = [_TYPE_TO_ATTR.get(t, 0) for t in ttypes[:n]]
    to_id = {t: i for i, t in enumerate(tokens)}
    eog = _eog_by_text(tokens, to_id, attrs, ids)

    scores = None
    if kind == "spm":
        raw = md.get("tokenizer.ggml.scores")
        scores = [float(s) for s in _as_list(raw)] if raw is not None else [0.0] * n

    # Per-model attribute tweaks llama.cpp applies by name (phi-3: special tokens eat the
    # whitespace after them).
    name = str(md.get("general.name", "")).lower()
    if "phi-3" in name or "phi3" in name:
        for i, a in enumerate(attrs):
            if a & (_A_CONTROL | _A_USER_DEFINED | _A_UNKNOWN):
                attrs[i] = a | _A_RSTRIP
        for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if t in to_id:
                i = to_id[t]
                attrs[i] = attrs[i] | _A_RSTRIP if on else attrs[i] & ~_A_RSTRIP

    bpe = None
    escape = flags.get("escape_whitespace", False)
    if kind == "bpe":
        merges = md.get("tokenizer.ggml.merges")
        if merges is None:
            raise FrinkError(f"{where}: GGUF BPE vocabulary has no tokenizer.ggml.merges")
        regexes = None if escape else _PRE_REGEXES[pre_family]
        bpe = _build_bpe(to_id, list(merges), regexes, ignore_merges, ckpt.notes)
    core = _GgufCore(
        tokens,
        to_id,
        attrs,
        scores,
        kind,
        add_space_prefix,
        ids["unk"],
        bpe,
        escape_whitespace=escape,
    )
    template = md.get("tokenizer.chat_template")
    return Tokenizer(
        core,
        bos_id=ids["bos"],
        eos_id=ids["eos"],
        eog_ids=eog,
        add_bos=add_bos,
        add_eos=add_eos,
        chat_template=str(template) if template else None,
        source="gguf",
    )


def _eog_by_text(
    tokens: list[str], to_id: dict[str, int], attrs: list[int], ids: dict[str, int | None]
) -> set[int]:
    """End-of-generation ids as llama-vocab.cpp derives them; updates `attrs` the same way.

    llama.cpp walks an unordered_map, so when several texts qualify for one FIM role the one
    it picks is unspecified; the lowest id is picked here.
    """

    def force_control(i: int) -> None:
        attrs[i] |= _A_CONTROL

    if ids.get("eot") is None:
        found = sorted(to_id[t] for t in _EOT_TEXTS if t in to_id)
        if found:
            ids["eot"] = found[0]
            force_control(found[0])
    if ids.get("eom") is None and "<|eom_id|>" in to_id:
        eom = ids["eom"] = to_id["<|eom_id|>"]
        force_control(eom)
    for role, texts in _FIM_TEXTS.items():
        if ids.get(role) is None:
            found = sorted(to_id[t] for t in texts if t in to_id)
            if found:
                ids[role] = found[0]
                force_control(found[0])
    for i, t in enumerate(tokens):  # "unused" control tokens
        if attrs[i] & _A_CONTROL and "unused" in t:
            attrs[i] |= _A_UNUSED

    eog = {tid for tid in (ids.get(r) for r in _EOG_FIM) if tid is not None}
    for t in _EOG_TEXTS:
        eog_id = to_id.get(t)
        if eog_id is not None:
            eog.add(eog_id)
            force_control(eog_id)
    for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss: shown
        if t in to_id:
            attrs[to_id[t]] = _A_USER_DEFINED
    for r in ("eos", "eot", "eom"):
        rid = ids.get(r)
        if rid is not None:
            eog.add(rid)

    _drop_non_eog(eog, {tokens[i]: i for i in eog}, attrs)
    return eog


def _drop_non_eog(eog: set[int], texts: dict[str, int], attrs: list[int] | None) -> None:
    """llama.cpp's two exceptions to its text list, given the EOG set's texts -> ids."""
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    # o200k_harmony / solar-open: "<|end|>" ends a message, not the generation
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
        if attrs is not None:
            attrs[texts["<|end|>"]] = _A_USER_DEFINED
    # gemma4 / plamo: "</s>" is an ordinary token there
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        if attrs is not None:
            attrs[texts["</s>"]] = _A_NORMAL


# ---------------------------------------------------------------------------------------
# Hugging Face directories
# ---------------------------------------------------------------------------------------


class _HfCore(_Core):
    def __init__(self, tk: Any) -> None:
        self.tk = tk
        self.n_vocab = tk.get_vocab_size(with_added_tokens=True)
        added = tk.get_added_tokens_decoder()
        self.special_ids = {i for i, a in added.items() if a.special}
        self.added_text = {i: a.content for i, a in added.items()}
        dec = _json_of(tk.decoder)
        self.byte_level = _mentions(dec, "ByteLevel")
        model = _json_of(tk.model)
        self.byte_fallback = bool(model.get("byte_fallback", False))
        self._pieces: dict[int, bytes] = {}
        # encode_text switches the tokenizer's encode_special_tokens for one call: calls
        # from several threads (a server's requests) must not see each other's setting.
        self._encode_lock = threading.Lock()

    def make_control(self, ids: Iterable[int]) -> None:
        """Turn these tokens into special added tokens (llama.cpp's forced CONTROL type)."""
        from tokenizers import AddedToken

        added = self.tk.get_added_tokens_decoder()
        new = []
        for i in sorted(ids):
            if i in self.special_ids:
                continue
            a = added.get(i)
            if a is not None:
                new.append(
                    AddedToken(
                        a.content,
                        single_word=a.single_word,
                        lstrip=a.lstrip,
                        rstrip=a.rstrip,
                        normalized=a.normalized,
                        special=True,
                    )
                )
            else:
                new.append(AddedToken(self.token_text(i), normalized=False, special=True))
        if new:
            self.tk.add_special_tokens(new)
            for t in new:
                i = self.tk.token_to_id(t.content)
                self.special_ids.add(i)
                self.added_text[i] = t.content
            self._pieces.clear()

    def encode_text(self, text: str, parse_special: bool) -> list[int]:
        if not text:
            return []
        with self._encode_lock:
            if parse_special:
                return list(self.tk.encode(text, add_special_tokens=False).ids)
            # `tokenizers` then spells special added tokens as text; non-special added
            # tokens are still split out, as llama.cpp does with user-defined tokens.
            self.tk.encode_special_tokens = True
            try:
                return list(self.tk.encode(text, add_special_tokens=False).ids)
            finally:
                self.tk.encode_special_tokens = False

    def piece(self, token_id: int) -> bytes:
        p = self._pieces.get(token_id)
        if p is not None:
            return p
        if token_id in self.special_ids:
            p = b""
        elif token_id in self.added_text:
            p = self.added_text[token_id].encode()
        else:
            text = self.tk.id_to_token(token_id) or ""
            m = _HEX_BYTE.fullmatch(text) if self.byte_fallback else None
            if m:
                p = bytes([int(m.group(1), 16)])
            elif self.byte_level:
                p = _byte_level_decode(text)
            else:
                p = text.replace("\u2581", " ").encode()
        self._pieces[token_id] = p
        return p

    def token_text(self, token_id: int) -> str:
        return self.tk.id_to_token(token_id) or ""

    def max_token_chars(self) -> int:
        return max(map(len, self.tk.get_vocab(with_added_tokens=True)), default=1)

    def control_texts(self) -> list[str]:
        return [self.added_text[i] for i in self.special_ids if i in self.added_text]

    def token_id(self, text: str) -> int | None:
        return self.tk.token_to_id(text)


def _json_of(component: Any) -> dict:
    """A `tokenizers` component's own JSON description (pickled state), {} if unavailable."""
    if component is None:
        return {}
    try:
        state = component.__getstate__()
        return json.loads(state) if isinstance(state, (bytes, str)) else {}
    except Exception:  # noqa: BLE001 - an odd component just means "no hints"
        return {}


def _mentions(tree: Any, type_name: str) -> bool:
    if isinstance(tree, dict):
        return tree.get("type") == type_name or any(_mentions(v, type_name) for v in tree.values())
    if isinstance(tree, list):
        return any(_mentions(v, type_name) for v in tree)
    return False


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    data = read_json(path)
    return data if isinstance(data, dict) else {}


def _token_content(v: Any) -> str | None:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _chat_template_from_dir(d: Path, config: dict) -> str | None:
    jinja = d / "chat_template.jinja"
    if jinja.exists():
        raw = read_model_file(jinja, "chat template")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FrinkError(f"{jinja}: not UTF-8 text (byte {e.start})") from None
    tmpl: Any = _read_json(d / "chat_template.json").get("chat_template")
    if tmpl is None:
        tmpl = config.get("chat_template")
    if isinstance(tmpl, list):  # named templates: the default one
        for i, t in enumerate(tmpl):
            if not (
                isinstance(t, dict)
                and isinstance(t.get("name"), str)
                and isinstance(t.get("template"), str)
            ):
                raise FrinkError(
                    f"{d}: chat_template entry {i} is not a {{name, template}} pair of strings"
                )
        named = {t["name"]: t["template"] for t in tmpl}
        tmpl = named.get("default") or next(iter(named.values()), None)
    if tmpl is not None and not isinstance(tmpl, str):
        raise FrinkError(
            f"{d}: chat_template must be a string or a list of named templates "
            f"(got {type(tmpl).__name__})"
        )
    return tmpl


def _ids_of(v: Any) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v]
    if isinstance(v, list):
        return [x for x in v if isinstance(x, int) and not isinstance(x, bool)]
    return []


def _load_hf(d: Path) -> Tokenizer | None:
    path = d / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer as HfTokenizer

    try:
        tk = HfTokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure is a bad file
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise FrinkError(f"{path}: cannot load tokenizer ({first})") from None
    core = _HfCore(tk)
    config = _read_json(d / "tokenizer_config.json")
    model_cfg = _read_json(d / "config.json")
    gen_cfg = _read_json(d / "generation_config.json")

    def lookup(text: str | None) -> int | None:
        return tk.token_to_id(text) if text else None

    bos_id = lookup(_token_content(config.get("bos_token")))
    eos_id = lookup(_token_content(config.get("eos_token")))
    for cfg in (gen_cfg, model_cfg):
        if bos_id is None and _ids_of(cfg.get("bos_token_id")):
            bos_id = _ids_of(cfg.get("bos_token_id"))[0]
        if eos_id is None and _ids_of(cfg.get("eos_token_id")):
            eos_id = _ids_of(cfg.get("eos_token_id"))[0]

    # BOS/EOS policy: tokenizer_config's flags when present, else what the post-processor
    # adds around a plain text (how transformers encodes with add_special_tokens=True).
    plain = tk.encode("a", add_special_tokens=False).ids
    full = tk.encode("a", add_special_tokens=True).ids
    k = _find_sub(full, plain)
    prefix, suffix = (full[:k], full[k + len(plain) :]) if k >= 0 else ([], [])
    add_bos = config.get("add_bos_token")
    if not isinstance(add_bos, bool):
        add_bos = bos_id is not None and prefix[-1:] == [bos_id]
    add_eos = config.get("add_eos_token")
    if not isinstance(add_eos, bool):
        add_eos = eos_id is not None and suffix[:1] == [eos_id]

    # The same end-of-generation texts and FIM roles as for GGUF files, so a model stops at
    # the same tokens either way; llama.cpp also makes those tokens control tokens, which
    # changes how they encode without parse_special and that they decode to nothing.
    eog = {i for t in _EOG_TEXTS if (i := tk.token_to_id(t)) is not None}
    control = set(eog)
    for role, texts in _FIM_TEXTS.items():
        found = sorted(i for t in texts if (i := tk.token_to_id(t)) is not None)
        if found:
            control.add(found[0])
            if role in _EOG_FIM:
                eog.add(found[0])
    for cfg in (model_cfg, gen_cfg):
        eog.update(i for i in _ids_of(cfg.get("eos_token_id")) if 0 <= i < core.n_vocab)
    if eos_id is not None:
        eog.add(eos_id)
    by_text = {core.token_text(i): i for i in eog}
    _drop_non_eog(eog, by_text, None)
    control -= set(by_text.values()) - eog  # the ones just ruled ordinary stay as they were
    core.make_control(control)
    return Tokenizer(
        core,
        bos_id=bos_id,
        eos_id=eos_id,
        eog_ids=eog,
        add_bos=add_bos,
        add_eos=add_eos,
        chat_template=_chat_template_from_dir(d, config),
        source="hf",
    )


def _find_sub(seq: list[int], sub: list[int]) -> int:
    for k in range(len(seq) - len(sub) + 1):
        if seq[k : k + len(sub)] == sub:
            return k
    return -1


def load_tokenizer(ckpt: Checkpoint) -> Tokenizer | None:
    """The checkpoint's tokenizer, or None when the file carries none.

    A Hugging Face directory is read from its tokenizer files; otherwise the GGUF
    metadata is used (tokenizer.ggml.model "none" or absent means no tokenizer).
    """
    if ckpt.hf_dir is not None:
        return _load_hf(Path(ckpt.hf_dir))
    return _load_gguf(ckpt)
