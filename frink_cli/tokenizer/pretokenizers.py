"""Pre-tokenizer regexes by `tokenizer.ggml.pre` name, as llm_tokenizer_bpe's constructor
sets them up, and the loader flags each name turns on.

`PRE_REGEXES` maps a regex family to its splits (applied in order, each keeping both the
matches and the text between them); `PRE_NAMES` maps every `tokenizer.ggml.pre` value
frink reads to its family and flags; `PRE_UNSUPPORTED` lists the names refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

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

PRE_REGEXES: dict[str, list[str]] = {
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
PRE_NAMES: dict[str, tuple[str, dict[str, bool]]] = {}


def _pre(family: str, names: Iterable[str], **flags: bool) -> None:
    for n in names:
        PRE_NAMES[n] = (family, flags)


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
PRE_UNSUPPORTED = {
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

LINES_OR_NEWLINES = re.compile(r"[^\n]+|\n+")  # the gemma4 pre-tokenizer's one split
