"""A `Tokenizer` from a Hugging Face directory: tokenizer.json through `tokenizers` (the
reference implementation for those files), BOS/EOS policy and the chat template from
tokenizer_config.json (and chat_template.jinja/.json), extra EOS ids from config.json and
generation_config.json."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import FrinkError
from ..formats.jsonfile import read_json, read_model_file
from .byte_level import HEX_BYTE, byte_level_decode
from .core import Core, Tokenizer
from .special import EOG_FIM, EOG_TEXTS, FIM_TEXTS, drop_non_eog


class HfVocab(Core):
    """A tokenizer.json loaded by `tokenizers`, as a `Core` with llama.cpp's rules for
    special tokens (they decode to nothing) and pieces."""

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
            m = HEX_BYTE.fullmatch(text) if self.byte_fallback else None
            if m:
                p = bytes([int(m.group(1), 16)])
            elif self.byte_level:
                p = byte_level_decode(text)
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


def load_hf(d: Path) -> Tokenizer | None:
    path = d / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer as HfTokenizer

    try:
        tk = HfTokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure is a bad file
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise FrinkError(f"{path}: cannot load tokenizer ({first})") from None
    # A tokenizer.json may carry padding and truncation for a training batch (BERT's: pad
    # and cut to 128); transformers sets both per call, and frink wants each text's own ids.
    tk.no_padding()
    tk.no_truncation()
    core = HfVocab(tk)
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
    # No BOS/EOS named, but the post-processor wraps a text in one token each (BERT's [CLS]
    # and [SEP]): those are its BOS and EOS, as llama.cpp's bert vocabulary has them.
    if bos_id is None and eos_id is None and len(prefix) == 1 and len(suffix) == 1:
        bos_id, eos_id = prefix[0], suffix[0]
    add_bos = config.get("add_bos_token")
    if not isinstance(add_bos, bool):
        add_bos = bos_id is not None and prefix[-1:] == [bos_id]
    add_eos = config.get("add_eos_token")
    if not isinstance(add_eos, bool):
        add_eos = eos_id is not None and suffix[:1] == [eos_id]

    # The same end-of-generation texts and FIM roles as for GGUF files, so a model stops at
    # the same tokens either way; llama.cpp also makes those tokens control tokens, which
    # changes how they encode without parse_special and that they decode to nothing.
    eog = {i for t in EOG_TEXTS if (i := tk.token_to_id(t)) is not None}
    control = set(eog)
    for role, texts in FIM_TEXTS.items():
        found = sorted(i for t in texts if (i := tk.token_to_id(t)) is not None)
        if found:
            control.add(found[0])
            if role in EOG_FIM:
                eog.add(found[0])
    for cfg in (model_cfg, gen_cfg):
        eog.update(i for i in _ids_of(cfg.get("eos_token_id")) if 0 <= i < core.n_vocab)
    if eos_id is not None:
        eog.add(eos_id)
    by_text = {core.token_text(i): i for i in eog}
    drop_non_eog(eog, by_text, None)
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
