"""The Python API: load a model file, then tokenize, score, generate and chat (with tools).

`load()` is the one path from a file to a runnable model, used by the CLI, the tests and
anyone embedding frink: open the checkpoint, read its config, load and fuse weights, build
the tokenizer, pick the backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from .archs import config_from_checkpoint, open_checkpoint
from .archs.lora_files import read_adapters
from .backends import Backend, carried_cache_types, select_backend
from .cache.kv_cache import check_cache_types
from .cache.kv_types import CacheTypes, requested_cache_types
from .chat import chat_ids, prompt_ids
from .constraint import Constraint, Grammar, compile_constraint
from .decoder import Decoder
from .draft_budget import DraftBudget
from .embedding import EmbedPlan, default_plan, embed_ids, read_plan
from .errors import FrinkError
from .formats import Checkpoint
from .formats.checkpoint import TensorSource
from .generate import GenerationStats, generate_tokens
from .model import ModelConfig, load_weights
from .model.expert_cache import ExpertCache
from .model.lora import LoraAdapter, check_attached
from .model.mem_budget import Budget, BudgetPlan, budget_plan
from .model.validate import check_tensors as scan_tensors
from .model.weights import LayerStore, ModelWeights, unread_tensors
from .mtp import MtpDrafter, MtpHead, nextn_layers
from .prompt_lookup import NgramDrafter
from .quant.kernels import check_isa
from .sampling import Sampler, SamplingParams
from .speculative import (
    Drafter,
    ModelDrafter,
    SpecParams,
    check_same_vocab,
    speculative_tokens,
)
from .tokenizer import Tokenizer, load_tokenizer
from .toolcalls import Event, ToolCall
from .toolcalls.plan import CHOICES, ToolPlan, tool_plan

DEFAULT_CTX = 4096


class Stage(Protocol):
    """One rank's part of a pipeline (frink_cli/distributed): asked once the config is
    known, before any weight loads."""

    def plan(
        self, cfg: ModelConfig, path: Path, tensors: TensorSource, backend: str
    ) -> tuple[range, tuple[bool, bool]]:
        """(the layers this stage runs, whether it embeds and whether it runs the head);
        tensors: the file's, whose sizes the split may weigh."""
        ...

    def reads(self, tensor: str) -> bool:
        """Whether this stage must read `tensor` (the unread-tensor check asks)."""
        ...

    def decoder(
        self, cfg: ModelConfig, weights: ModelWeights, backend, types: CacheTypes, layers: range
    ) -> Decoder:
        """The stage's decoder over its layers."""
        ...


@dataclass
class ChatReply:
    """One assistant turn: its text (content outside tool calls) and the calls it made,
    in order (ToolCall: name, arguments as JSON text and as parsed JSON (.args), id)."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)


class Model:
    def __init__(
        self,
        checkpoint: Checkpoint,
        config: ModelConfig,
        decoder: Decoder,
        tokenizer: Tokenizer | None,
        backend_name: str,
    ) -> None:
        self.checkpoint = checkpoint
        self.config = config
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.backend_name = backend_name
        # Speculative decoding (Model.speculate): its settings and the draft model, if any.
        self.speculation: tuple[SpecParams, Model | None] | None = None
        self._mtp: MtpHead | None = None  # speculation's MTP head (SpecParams.mtp)
        self._embed_plan: EmbedPlan | None = None
        # Under a --mem-budget the model does not fit: the cache its experts are read through.
        self.expert_cache: ExpertCache | None = None

    @property
    def lora(self) -> list[LoraAdapter]:
        """The LoRA adapters it was loaded with, in order (each one's `scale` may be set
        while it runs)."""
        return self.decoder.lora

    @property
    def n_vocab(self) -> int:
        return self.config.n_vocab

    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise FrinkError(
                f"{self.checkpoint.path}: the model has no tokenizer (tokenizer model 'none')"
            )
        return self.tokenizer

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self._tok().encode(text, add_special=add_special)

    def detokenize(self, ids: list[int]) -> str:
        return self._tok().decode(list(ids))

    def _check_ids(self, ids: np.ndarray) -> None:
        if ids.ndim != 1 or len(ids) == 0:
            raise FrinkError("token ids must be a non-empty 1-D sequence")
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise FrinkError(f"token id out of range [0, {self.n_vocab})")

    def logits(self, ids, step: bool = False, n_ctx: int | None = None) -> np.ndarray:
        """Logits [len(ids), n_vocab] from a fresh context; step=True feeds the ids one at a
        time through the decode path instead of one batched prefill."""
        ids = np.asarray(ids, dtype=np.int64)
        self._check_ids(ids)
        cache = self.decoder.new_cache(n_ctx or max(len(ids), 1))
        if not step:
            return self.decoder.step(ids, cache, all_logits=True)
        return np.concatenate([self.decoder.step(ids[i : i + 1], cache) for i in range(len(ids))])

    @property
    def embed_plan(self) -> EmbedPlan:
        """How embed() pools: the folder's sentence-transformers modules, the GGUF's
        pooling_type, else mean (an encoder) or the last token (a decoder)."""
        if self._embed_plan is None:
            encoder = self.config.ext.embeds_only()
            if self.checkpoint.hf_dir is not None:
                self._embed_plan = read_plan(Path(self.checkpoint.hf_dir), encoder)
            else:
                pooling = self.checkpoint.metadata.get(f"{self.config.arch}.pooling_type")
                dense = self.config.ext.pooled_dense(self.decoder.host.w.arch)
                self._embed_plan = default_plan(encoder, pooling, dense)
        return self._embed_plan

    @embed_plan.setter
    def embed_plan(self, plan: EmbedPlan) -> None:
        """Pool otherwise (llama-server's --pooling: EmbedPlan(pooling="mean"))."""
        self._embed_plan = plan

    @property
    def embed_ctx(self) -> int:
        """The longest input embed() takes, in tokens (special tokens included)."""
        return self.embed_plan.max_len or self.config.n_ctx_train

    def embed_tokens(self, text: str, truncate: bool = False) -> list[int]:
        """A text's ids as embed() feeds them (special tokens added), cut to embed_ctx when
        truncate (the end token kept), else refused when longer."""
        tok = self._tok()
        # Wrapped whatever the text holds (a text starting with "[CLS]" still gets its own),
        # as the HF tokenizer's post-processor wraps it.
        bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
        end = [tok.eos_id] if tok.add_eos and tok.eos_id is not None else []
        if tok.add_sep and tok.sep_id is not None:  # a GGUF BERT vocabulary's [SEP]
            end.append(tok.sep_id)
        ids = bos + tok.encode(text, add_special=False) + end
        return self._fit(ids, truncate, end[-1] if end else None)

    def _fit(self, ids: list[int], truncate: bool, end: int | None = None) -> list[int]:
        n = self.embed_ctx
        if not ids:
            raise FrinkError("an input to embed has no tokens")
        if len(ids) <= n:
            return ids
        if not truncate:
            raise FrinkError(f"an input of {len(ids)} tokens is longer than the model's {n}")
        return ids[: n - 1] + [end] if end is not None and ids[-1] == end else ids[:n]

    def embed(self, texts: str | Sequence[str], truncate: bool = False) -> np.ndarray:
        """Texts -> their embeddings [len(texts), dim] (f32; unit length where the model
        normalizes), all inputs batched through one forward per BATCH."""
        if isinstance(texts, str):
            texts = [texts]
        return self.embed_ids([self.embed_tokens(t, truncate) for t in texts], truncate)

    def embed_ids(self, seqs: Sequence[Sequence[int]], truncate: bool = False) -> np.ndarray:
        """Token id sequences (fed as they are) -> their embeddings [len(seqs), dim]."""
        fitted = []
        for s in seqs:
            self._check_ids(np.asarray(s, dtype=np.int64))
            fitted.append(self._fit(list(s), truncate))
        return embed_ids(self.decoder, fitted, self.embed_plan)

    def prompt_ids(
        self,
        prompt: str,
        *,
        raw: bool = False,
        system: str | None = None,
        notes: list[str] | None = None,
        n_ctx: int | None = None,
    ) -> list[int]:
        """Ids of `prompt`; with n_ctx, text that cannot fit is refused before tokenizing."""
        return prompt_ids(self._tok(), prompt, system=system, raw=raw, notes=notes, n_ctx=n_ctx)

    def constraint(
        self,
        *,
        json_schema: object = None,
        grammar: str | None = None,
        regex: str | None = None,
    ) -> Constraint | None:
        """The constraint for at most one of: a JSON schema (an object or JSON text;
        True or {"type": "object"} for any object), a grammar (llama.cpp GBNF or
        llguidance Lark), a regex. None when none is given; GrammarError (a FrinkError)
        when it does not compile or asks for what llguidance cannot enforce."""
        given = [
            g
            for g in (
                Grammar.json_schema({} if json_schema is True else json_schema)
                if json_schema is not None
                else None,
                Grammar("gbnf", grammar, "grammar") if grammar is not None else None,
                Grammar("regex", regex, "regex") if regex is not None else None,
            )
            if g is not None
        ]
        if not given:
            return None
        if len(given) > 1:
            raise FrinkError("give one of json_schema, grammar and regex, not several")
        return compile_constraint(self._tok(), given[0])[0]

    def generate_ids(
        self,
        ids: list[int],
        *,
        max_tokens: int = 128,
        n_ctx: int | None = None,
        stats: GenerationStats | None = None,
        constraint: Constraint | None = None,
        **sampling,
    ) -> Iterator[int]:
        """Yield generated token ids; `constraint` (Model.constraint) masks each step."""
        params = SamplingParams(**sampling)
        return self._generate_ids(ids, params, max_tokens, n_ctx, stats, constraint)

    def speculate(self, params: SpecParams | None, draft: Model | None = None) -> None:
        """Decode speculatively from now on (None: plainly again): drafts from the file's
        MTP head (params.mtp; FrinkError where it has none), from `draft`, a smaller model
        with this one's vocabulary (FrinkError naming it otherwise), or by prompt lookup.
        A generation under a constraint decodes plainly."""
        if params is not None and draft is not None:
            name = str(draft.checkpoint.path)
            if draft.n_vocab != self.n_vocab:
                raise FrinkError(
                    f"draft model {name}: {draft.n_vocab} token embeddings, the target's "
                    f"{self.n_vocab}; speculative decoding needs the same vocabulary"
                )
            if self.tokenizer is not None or draft.tokenizer is not None:
                check_same_vocab(self._tok(), draft._tok(), name)
        self._mtp = None
        if params is not None and params.mtp:
            self._mtp = MtpHead(self.checkpoint, self.decoder)  # FrinkError where it has none
        self.speculation = None if params is None else (params, draft)

    def drafter(self, n_ctx: int) -> Drafter | None:
        """Model.speculate's drafter, fresh for a generation of n_ctx tokens (None: plain)."""
        if self.speculation is None:
            return None
        spec, draft = self.speculation
        if self._mtp is not None:
            return MtpDrafter(self._mtp, n_ctx, spec)
        lookup = NgramDrafter(spec, DraftBudget((draft or self).decoder.backend is not None))
        if draft is None:
            return lookup
        return ModelDrafter(draft.decoder, n_ctx, spec, lookup if spec.lookup else None)

    def _generate_ids(
        self,
        ids: list[int],
        params: SamplingParams,
        max_tokens: int,
        n_ctx: int | None,
        stats: GenerationStats | None,
        constraint: Constraint | None,
    ) -> Iterator[int]:
        sampler = Sampler(params, self.n_vocab)
        eog = self.tokenizer.eog_ids if self.tokenizer else frozenset()
        n_ctx = n_ctx or min(self.config.n_ctx_train, DEFAULT_CTX)
        drafter = self.drafter(n_ctx)
        if self.speculation is not None and drafter is not None and constraint is None:
            return speculative_tokens(
                self.decoder,
                ids,
                sampler,
                drafter,
                self.speculation[0],
                max_tokens=max_tokens,
                n_ctx=n_ctx,
                eog_ids=eog,
                stats=stats,
            )
        return generate_tokens(
            self.decoder,
            ids,
            sampler,
            max_tokens=max_tokens,
            n_ctx=n_ctx,
            eog_ids=eog,
            stats=stats,
            constraint=constraint,
        )

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 128,
        raw: bool = False,
        system: str | None = None,
        n_ctx: int | None = None,
        stats: GenerationStats | None = None,
        json_schema: object = None,
        grammar: str | None = None,
        regex: str | None = None,
        **sampling,
    ) -> Iterator[str]:
        """Yield the generated text piece by piece (whole UTF-8 characters only).

        A string prompt goes through prompt_ids (the chat template unless raw); token ids
        go in as they are, for a caller that made them with prompt_ids (to show its notes
        or keep the ids). Sampling keywords are SamplingParams' fields. At most one of
        json_schema, grammar (GBNF or Lark) and regex constrains the output (see
        Model.constraint); it is compiled before anything is generated."""
        tok = self._tok()
        constraint = self.constraint(json_schema=json_schema, grammar=grammar, regex=regex)
        if isinstance(prompt, str):
            ids = self.prompt_ids(
                prompt,
                raw=raw,
                system=system,
                n_ctx=n_ctx or min(self.config.n_ctx_train, DEFAULT_CTX),
            )
        else:
            ids = list(prompt)
        stream = tok.stream()
        tokens = self.generate_ids(
            ids, max_tokens=max_tokens, n_ctx=n_ctx, stats=stats, constraint=constraint, **sampling
        )
        for token in tokens:
            piece = stream.push(token)
            if piece:
                yield piece
        tail = stream.flush()
        if tail:
            yield tail

    def chat(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
        parallel_tool_calls: bool = True,
        max_tokens: int = 512,
        n_ctx: int | None = None,
        stats: GenerationStats | None = None,
        **sampling,
    ) -> ChatReply:
        """The assistant's next turn for `messages` (OpenAI-shaped: role and content; an
        assistant's tool_calls with arguments as objects and a tool message's
        tool_call_id and name, as the chat template reads them), through the model's
        chat template, which is shown `tools` (OpenAI function tools).

        The answer's calls are parsed in the format the template teaches
        (frink_cli/toolcalls/). tool_choice: "auto" (the default with tools; once the
        model opens a call its arguments are constrained), "none", "required", or one
        tool, by name or as {"type": "function", "function": {"name": ...}}: "required"
        and a named tool put the call under the constrained decoder, so it is valid
        against the tool's parameters schema. A bad tools or tool_choice value is a
        FrinkError. Sampling keywords are SamplingParams' fields."""
        tok = self._tok()
        plan = _tool_plan(tools, tool_choice, parallel_tool_calls, tok)
        params = SamplingParams(**sampling)
        constraint = None
        if plan is not None and not plan.calls:
            params = plan.without_calls(params, tok)
        elif plan is not None:
            grammar, triggers = plan.grammar(tok)
            constraint = compile_constraint(tok, grammar, triggers)[0]
        ctx = n_ctx or min(self.config.n_ctx_train, DEFAULT_CTX)
        msgs = plan.messages(list(messages)) if plan is not None else list(messages)
        offered = plan.template_tools() if plan is not None else None
        ids = chat_ids(tok, msgs, n_ctx=ctx, tools=offered)
        parser = plan.parser() if plan is not None and plan.calls else None
        events: list[Event] = []
        stream = tok.stream()
        spell = plan.spelled(tok) if plan is not None else frozenset()
        pieces = [
            stream.push(t) + (stream.flush() + tok.token_text(t) if t in spell else "")
            for t in self._generate_ids(ids, params, max_tokens, ctx, stats, constraint)
        ]
        pieces.append(stream.flush())
        for piece in pieces:
            if piece:
                events += parser.push(piece) if parser is not None else [("content", piece)]
        if parser is not None:
            events += parser.finish()
        text = "".join(v for k, v in events if k == "content")
        return ChatReply(text, [v for k, v in events if k == "call"])


def _tool_plan(
    tools: list[dict] | None, choice: str | dict | None, parallel: bool, tok: Tokenizer
) -> ToolPlan | None:
    """Model.chat's tools and tool_choice, checked, as a ToolPlan (None: no tools)."""
    if not tools:
        if choice not in (None, "none"):
            raise FrinkError("tool_choice needs tools")
        return None
    names = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise FrinkError(f"tools[{i}] is not a function tool with a name")
        if f.get("parameters") is not None and not isinstance(f["parameters"], dict):
            raise FrinkError(f"tools[{i}].function.parameters must be a JSON schema object")
        names.append(f["name"])
    if len(set(names)) < len(names):
        raise FrinkError("tools: a function name is defined twice")
    if choice is None or choice in CHOICES:
        return tool_plan(tools, choice or "auto", parallel, tok)
    f = choice.get("function") if isinstance(choice, dict) else None
    name = f.get("name") if isinstance(f, dict) else choice
    if not isinstance(name, str) or name not in names:
        raise FrinkError(
            f"tool_choice must be auto, none, required or the name of one of the tools "
            f"(got {name!r})"
        )
    return tool_plan(tools, "required", parallel, tok, name=name)


def _refuse_unread_tensors(
    ckpt: Checkpoint, cfg: ModelConfig, weights: ModelWeights, stage: Stage | None = None
) -> None:
    """No model feature is silently dropped: a tensor the file holds and frink never read
    means the model computes something frink does not, so the model is refused by name
    (a pipeline stage answers for its own tensors). The NextN (MTP) blocks after the trunk
    are not the model's output, only a drafter's (--spec mtp reads them), as in llama.cpp."""
    nextn = tuple(f"blk.{i}." for i in range(cfg.n_layer, cfg.n_layer + nextn_layers(ckpt, cfg)))
    unread = [
        t
        for t in unread_tensors(ckpt, weights)
        if (stage is None or stage.reads(t)) and not t.startswith(nextn)
    ]
    if unread:
        more = f" (+{len(unread) - 3} more)" if len(unread) > 3 else ""
        raise FrinkError(
            f"{ckpt.path}: {len(unread)} tensor(s) frink does not use: "
            f"{', '.join(unread[:3])}{more}; the model needs a feature frink does not carry"
        )


def _checked_adapters(
    ckpt: Checkpoint,
    cfg: ModelConfig,
    lora: Sequence[tuple[str | Path, float]],
    apply: bool,
    merge: bool,
    backend: str,
    stage: Stage | None,
) -> list[LoraAdapter]:
    """load()'s adapters, read and checked against the file, the backend and the stage."""
    adapters = read_adapters(lora, ckpt, cfg, apply)
    if merge and not (adapters and apply):
        raise FrinkError(
            "--lora-merge: needs adapters applied at load (a --lora, no --lora-init-without-apply)"
        )
    if adapters and backend not in ("numpy", "metal", "auto"):
        raise FrinkError(
            f"{backend}: LoRA adapters are not supported on this backend (numpy and metal run them)"
        )
    if adapters and stage is not None:
        raise FrinkError("LoRA adapters are not supported in a pipeline (mlx.launch) yet")
    return adapters


def _chosen_backend(
    ckpt: Checkpoint,
    cfg: ModelConfig,
    backend: str,
    types: CacheTypes,
    budget: BudgetPlan | None,
    adapters: list[LoraAdapter],
    stage: Stage | None,
) -> Backend | None:
    """The backend load() runs the model's layers on (None: the host body alone)."""
    streams = budget is not None and budget.streams
    if streams and stage is not None:
        raise FrinkError("--mem-budget: experts left in the file are not supported in a pipeline")
    chosen = select_backend("numpy" if streams else backend, cfg, ckpt, types)
    if adapters and chosen is not None and not chosen.runs_lora:
        chosen = None  # "auto" found a backend that does not carry adapters: the host
    return chosen


def load(
    path: str | Path,
    backend: str = "numpy",
    progress: Callable[[int, int], None] | None = None,
    check_tensors: bool = False,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    lora: Sequence[tuple[str | Path, float]] = (),
    lora_apply: bool = True,
    stage: Stage | None = None,
    mem_budget: Budget = None,
    lora_merge: bool = False,
) -> Model:
    """check_tensors: scan every weight for NaN/Inf first (llama.cpp's --check-tensors).
    lora: LoRA adapters (a GGUF adapter file or a PEFT directory, and its scale), applied
    unmerged (archs/lora_files.py, model/lora.py); lora_apply=False loads them at scale 0
    (--lora-init-without-apply). lora_merge: added into the f32 rows of the matrices they
    adapt at load (--lora-merge: faster; the scales are then fixed, and the model lists no
    adapters). The host body and metal run adapters: a backend that does not (cuda) is
    refused by name when named, passed over by "auto".
    stage: load one rank's part of a pipeline (frink_cli/distributed) and run it there.
    cache_type_k / cache_type_v: how every cache of the model stores its K and V rows
    (-ctk / -ctv: f32, f16, bf16, q8_0, q4_0); None: $FRINK_CACHE_TYPE_K / _V, else f16
    (f32 on cuda). An unknown type, or a chosen one the backend cannot hold, is a
    FrinkError before anything loads, as is a forced ISA (FRINK_NATIVE_ISA) the CPU lacks.
    mem_budget: GiB the weights may hold (--mem-budget), or "auto" (the memory available
    less a margin): where the model does not fit, its routed experts stay in the file and
    a cache of the hot ones fills what the dense weights leave (model/mem_budget.py;
    `Model.expert_cache` counts hits and reads). None: "auto" for a MoE model that does not
    fit the memory available, else every weight resident."""
    check_isa()
    types = requested_cache_types(cache_type_k, cache_type_v)
    ckpt = open_checkpoint(path)
    cfg = config_from_checkpoint(ckpt)
    if check_tensors:
        scan_tensors(ckpt)
    # Before the (slow) weight load, so an unavailable backend is refused at once.
    check_cache_types(cfg, types)
    adapters = _checked_adapters(ckpt, cfg, lora, lora_apply, lora_merge, backend, stage)
    budget = budget_plan(ckpt, cfg, mem_budget, backend)
    chosen = _chosen_backend(ckpt, cfg, backend, types, budget, adapters, stage)
    types = types.carried_by(carried_cache_types(chosen.name if chosen else "numpy"))
    # With a backend, layers load as its bind() uploads them and the decoder then keeps
    # host copies only of those the backend does not hold (model/weights.py).
    layers, ends = range(cfg.n_layer), (True, True)
    if stage is not None:
        layers, ends = stage.plan(cfg, Path(path), ckpt.tensors, chosen.name if chosen else "numpy")
    # A pipeline stage that does not embed never sees text: no vocabulary in its memory.
    tokenizer = load_tokenizer(ckpt) if ends[0] else None
    lazy = chosen is not None or stage is not None
    cache = budget.cache() if budget is not None else None
    weights = load_weights(
        ckpt,
        cfg,
        progress,
        lazy=lazy,
        ends=ends,
        lora=adapters,
        lora_merge=lora_merge,
        expert_cache=cache,
    )
    if stage is None:
        decoder = Decoder(cfg, weights, chosen, types)
    else:
        decoder = stage.decoder(cfg, weights, chosen, types, layers)
        for i in layers if chosen is None else ():
            weights.layers[i]  # the host body's layers, now rather than at the first token
    _refuse_unread_tensors(ckpt, cfg, weights, stage)
    check_attached(adapters)  # every layer is loaded now: the host body runs adapters
    if chosen is not None and progress:
        # load_weights' layers are a LayerStore (the decoder checks the same way).
        if isinstance(weights.layers, LayerStore):
            weights.layers.on_load = None  # later (fallback) reloads are not load progress
        progress(cfg.n_layer + 2, cfg.n_layer + 2)
    model = Model(ckpt, cfg, decoder, tokenizer, "numpy")
    model.backend_name = chosen.name if chosen else "numpy"
    decoder.lora = [] if lora_merge else adapters  # merged: part of the weights, fixed
    model.expert_cache = cache
    return model
