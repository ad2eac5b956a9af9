"""Which tokens end generation or are control tokens, as llama-vocab.cpp decides it.

Shared by both vocabulary sources (GGUF metadata and Hugging Face directories) so a model
stops at the same tokens whichever file it came from: llama_token_attr bits, the texts
llama.cpp treats as end-of-generation and FIM roles, and its two exceptions to that list.
"""

from __future__ import annotations

# llama_token_attr bits (llama.h)
A_UNKNOWN = 1 << 0
A_UNUSED = 1 << 1
A_NORMAL = 1 << 2
A_CONTROL = 1 << 3
A_USER_DEFINED = 1 << 4
A_BYTE = 1 << 5
A_LSTRIP = 1 << 7
A_RSTRIP = 1 << 8

# llama_token_type (tokenizer.ggml.token_type) -> attribute; anything else is UNDEFINED (0).
TYPE_TO_ATTR = {
    1: A_NORMAL,
    2: A_UNKNOWN,
    3: A_CONTROL,
    4: A_USER_DEFINED,
    5: A_UNUSED,
    6: A_BYTE,
}

# Tokens llama.cpp treats as end-of-generation by their text (llama-vocab.cpp, "maintain a
# list of tokens that cause end-of-generation"). Text-based because converters do not
# record which tokens end a turn.
EOG_TEXTS = frozenset(
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
FIM_TEXTS = {
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
EOG_FIM = ("pad", "rep", "sep")
EOT_TEXTS = (
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


def drop_non_eog(eog: set[int], texts: dict[str, int], attrs: list[int] | None) -> None:
    """llama.cpp's two exceptions to its text list, given the EOG set's texts -> ids."""
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    # o200k_harmony / solar-open: "<|end|>" ends a message, not the generation
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
        if attrs is not None:
            attrs[texts["<|end|>"]] = A_USER_DEFINED
    # gemma4 / plamo: "</s>" is an ordinary token there
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        if attrs is not None:
            attrs[texts["</s>"]] = A_NORMAL
