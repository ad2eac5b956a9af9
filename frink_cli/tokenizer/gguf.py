"""A `Tokenizer` from GGUF metadata (`tokenizer.ggml.*`), read as llama_vocab::impl::load
reads it: defaults per tokenizer model, the pre-tokenizer's flags, the file's special
ids, token attributes and the end-of-generation set."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import FrinkError
from .core import Tokenizer
from .gguf_vocab import GgufVocab, build_bpe
from .pretokenizers import PRE_NAMES, PRE_REGEXES, PRE_UNSUPPORTED
from .special import (
    A_CONTROL,
    A_NORMAL,
    A_RSTRIP,
    A_UNKNOWN,
    A_UNUSED,
    A_USER_DEFINED,
    EOG_FIM,
    EOG_TEXTS,
    EOT_TEXTS,
    FIM_TEXTS,
    TYPE_TO_ATTR,
    drop_non_eog,
)
from .wpm import WordPiece

if TYPE_CHECKING:
    from ..formats import Checkpoint


def _as_list(value: Any) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


# (role, tokenizer.ggml.* key) for the special ids a file may name; later keys win.
_SPECIAL_ID_KEYS = (
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
)


def load_gguf(ckpt: Checkpoint) -> Tokenizer | None:
    """The tokenizer in a GGUF file's metadata; None when tokenizer.ggml.model is absent,
    "none" or "no_vocab". Raises FrinkError for a vocabulary llama.cpp would refuse or
    frink cannot tokenize exactly (unknown model or pre-tokenizer, missing tokens/merges);
    appends to `ckpt.notes` what it had to assume or drop."""
    md = ckpt.metadata
    model = md.get("tokenizer.ggml.model")
    if model is None or model in ("none", "no_vocab"):
        return None
    where = str(ckpt.path)
    if model not in ("gpt2", "llama", "gemma4", "bert"):
        raise FrinkError(
            f"{where}: tokenizer model '{model}' is not supported (frink reads "
            "'gpt2' byte-level BPE, 'gemma4' SentencePiece-style BPE, 'llama' "
            "SentencePiece and 'bert' WordPiece vocabularies)"
        )
    if "tokenizer.ggml.tokens" not in md:
        raise FrinkError(f"{where}: GGUF has no tokenizer.ggml.tokens")
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(md["tokenizer.ggml.tokens"])]
    kind = {"llama": "spm", "bert": "wpm"}.get(model, "bpe")
    pre_family, flags = _pre_tokenizer(ckpt, model, where) if kind == "bpe" else ("default", {})
    ids, add_bos, add_eos, add_space_prefix = _special_policy(md, model, flags, len(tokens))
    to_id = {t: i for i, t in enumerate(tokens)}
    attrs, eog = _token_attrs(md, tokens, to_id, ids)

    scores = None
    if kind == "spm":
        raw = md.get("tokenizer.ggml.scores")
        scores = [float(s) for s in _as_list(raw)] if raw is not None else [0.0] * len(tokens)
    bpe = None
    escape = flags.get("escape_whitespace", False)
    if kind == "bpe":
        merges = md.get("tokenizer.ggml.merges")
        if merges is None:
            raise FrinkError(f"{where}: GGUF BPE vocabulary has no tokenizer.ggml.merges")
        regexes = None if escape else PRE_REGEXES[pre_family]
        ignore_merges = flags.get("ignore_merges", False)
        bpe = build_bpe(to_id, list(merges), regexes, ignore_merges, ckpt.notes)
    wpm = _wordpiece(md, tokens, ids["unk"]) if kind == "wpm" else None
    core = GgufVocab(
        tokens,
        to_id,
        attrs,
        scores,
        kind,
        add_space_prefix,
        ids["unk"],
        bpe,
        escape_whitespace=escape,
        wpm=wpm,
    )
    template = md.get("tokenizer.chat_template")
    sep_id, add_sep = _separator(md, model, len(tokens))
    return Tokenizer(
        core,
        bos_id=ids["bos"],
        eos_id=ids["eos"],
        eog_ids=eog,
        add_bos=add_bos,
        add_eos=add_eos,
        chat_template=str(template) if template else None,
        source="gguf",
        sep_id=sep_id,
        add_sep=add_sep,
    )


def _wordpiece(md: dict[str, Any], tokens: list[str], unk_id: int | None) -> WordPiece:
    """A "bert" vocabulary's WordPiece with its BertNormalizer options: lowercase (default
    on), strip_accents (default: as lowercase), as llama_vocab::impl::load reads them."""
    lowercase = bool(md.get("tokenizer.ggml.normalizer.lowercase", True))
    strip = bool(md.get("tokenizer.ggml.normalizer.strip_accents", lowercase))
    return WordPiece(tokens, unk_id, lowercase, strip)


def _separator(md: dict[str, Any], model: str, n: int) -> tuple[int | None, bool]:
    """(the separator id, whether encode appends it): "bert" vocabularies end a text with
    [SEP] (id 102 unless the file's seperator_token_id says otherwise; add_sep_token may
    turn it off); no other model has one."""
    if model != "bert":
        return None, False
    sep = md.get("tokenizer.ggml.seperator_token_id", 102)
    sep_id = int(sep) if sep is not None and 0 <= int(sep) < n else None
    return sep_id, bool(md.get("tokenizer.ggml.add_sep_token", True))


def _pre_tokenizer(ckpt: Checkpoint, model: str, where: str) -> tuple[str, dict[str, bool]]:
    """A BPE vocabulary's pre-tokenizer family and loader flags (pretokenizers.PRE_NAMES);
    gemma4 models use the gemma4 pre-tokenizer whatever is stored."""
    pre = "gemma4" if model == "gemma4" else ckpt.metadata.get("tokenizer.ggml.pre") or ""
    if not pre:
        ckpt.notes.append(
            "tokenizer: GGUF has no tokenizer.ggml.pre; using llama.cpp's "
            "'default' pre-tokenizer (generation quality may suffer)"
        )
        return "default", {}
    if pre in PRE_UNSUPPORTED:
        raise FrinkError(f"{where}: pre-tokenizer '{pre}' is not supported by frink")
    if pre in PRE_NAMES:
        return PRE_NAMES[pre]
    # llama.cpp refuses unknown names too, rather than tokenizing differently
    raise FrinkError(f"{where}: unknown pre-tokenizer type '{pre}' (tokenizer.ggml.pre)")


def _special_policy(
    md: dict[str, Any], model: str, flags: dict[str, bool], n: int
) -> tuple[dict[str, int | None], bool, bool, bool]:
    """(special ids by role, add_bos, add_eos, add_space_prefix): llama_vocab::impl::load's
    defaults per tokenizer model, the pre-tokenizer's flags, then what the file says."""
    if model == "llama":
        ids: dict[str, int | None] = {"bos": 1, "eos": 2, "unk": 0}
        add_bos, add_space_prefix = True, True
    elif model == "bert":  # [CLS] first; [SEP] is appended as the separator (_separator)
        ids = {"bos": 101, "eos": None, "unk": 100}
        add_bos, add_space_prefix = True, False
    elif model == "gemma4":  # no default ids
        ids = {"bos": None, "eos": None, "unk": None}
        add_bos, add_space_prefix = False, False
    else:
        ids = {"bos": 11, "eos": 11, "unk": None}
        add_bos, add_space_prefix = False, False
    add_eos = False
    ids.update({k: None for k in ("eot", "eom", "pre", "suf", "mid", "pad", "rep", "sep")})
    add_bos = flags.get("add_bos", add_bos)
    if flags.get("no_bos"):
        ids["bos"] = None
    if "tokenizer.ggml.add_space_prefix" in md:
        add_space_prefix = bool(md["tokenizer.ggml.add_space_prefix"])

    for k, v in ids.items():  # a default out of range is disabled
        if v is not None and v >= n:
            ids[k] = None
    for k, key in _SPECIAL_ID_KEYS:
        v = md.get("tokenizer.ggml." + key)
        if v is not None and 0 <= int(v) < n:
            ids[k] = int(v)
    if "tokenizer.ggml.add_bos_token" in md:
        add_bos = bool(md["tokenizer.ggml.add_bos_token"])
    if "tokenizer.ggml.add_eos_token" in md:
        add_eos = bool(md["tokenizer.ggml.add_eos_token"])
    if flags.get("force_bos"):  # llama.cpp's Gemma 4 workaround overrides the file's flag
        add_bos = True
    return ids, add_bos, add_eos, add_space_prefix


def _token_attrs(
    md: dict[str, Any], tokens: list[str], to_id: dict[str, int], ids: dict[str, int | None]
) -> tuple[list[int], set[int]]:
    """(each token's llama_token_attr bits, the end-of-generation ids); fills in the FIM and
    EOT roles of `ids` found by text, as llama-vocab.cpp does."""
    ttypes = md.get("tokenizer.ggml.token_type")
    if ttypes is None:
        attrs = [A_NORMAL] * len(tokens)
    else:
        ttypes = _as_list(ttypes)
        attrs = [TYPE_TO_ATTR.get(t, 0) for t in ttypes[: len(tokens)]]
    eog = _eog_by_text(tokens, to_id, attrs, ids)
    # Per-model attribute tweaks llama.cpp applies by name (phi-3: special tokens eat the
    # whitespace after them).
    name = str(md.get("general.name", "")).lower()
    if "phi-3" in name or "phi3" in name:
        for i, a in enumerate(attrs):
            if a & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN):
                attrs[i] = a | A_RSTRIP
        for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if t in to_id:
                i = to_id[t]
                attrs[i] = attrs[i] | A_RSTRIP if on else attrs[i] & ~A_RSTRIP
    return attrs, eog


def _eog_by_text(
    tokens: list[str], to_id: dict[str, int], attrs: list[int], ids: dict[str, int | None]
) -> set[int]:
    """End-of-generation ids as llama-vocab.cpp derives them; updates `attrs` the same way.

    llama.cpp walks an unordered_map, so when several texts qualify for one FIM role the one
    it picks is unspecified; the lowest id is picked here.
    """

    def force_control(i: int) -> None:
        attrs[i] |= A_CONTROL

    if ids.get("eot") is None:
        found = sorted(to_id[t] for t in EOT_TEXTS if t in to_id)
        if found:
            ids["eot"] = found[0]
            force_control(found[0])
    if ids.get("eom") is None and "<|eom_id|>" in to_id:
        eom = ids["eom"] = to_id["<|eom_id|>"]
        force_control(eom)
    for role, texts in FIM_TEXTS.items():
        if ids.get(role) is None:
            found = sorted(to_id[t] for t in texts if t in to_id)
            if found:
                ids[role] = found[0]
                force_control(found[0])
    for i, t in enumerate(tokens):  # "unused" control tokens
        if attrs[i] & A_CONTROL and "unused" in t:
            attrs[i] |= A_UNUSED

    eog = {tid for tid in (ids.get(r) for r in EOG_FIM) if tid is not None}
    for t in EOG_TEXTS:
        eog_id = to_id.get(t)
        if eog_id is not None:
            eog.add(eog_id)
            force_control(eog_id)
    for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss: shown
        if t in to_id:
            attrs[to_id[t]] = A_USER_DEFINED
    for r in ("eos", "eot", "eom"):
        rid = ids.get(r)
        if rid is not None:
            eog.add(rid)

    drop_non_eog(eog, {tokens[i]: i for i in eog}, attrs)
    return eog
