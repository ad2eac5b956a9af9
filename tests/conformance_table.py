"""The conformance table: one entry per architecture, the checks tests/test_conformance.py
runs on every one of them.

An entry names the architecture as its GGUF spells it (`general.architecture`), the tiny
fixtures of that architecture (scripts/tiny_specs.py), and what each check expects of it:
how long llama.cpp's greedy run and the reference sequence are, whether the HF directory
is checked against the converter's GGUF (and with which allowances), which fixtures the
metal and cuda backends run and what their ledgers must show, and whether the cache
refuses truncation. A check an entry leaves at its default (None, empty) is not run for it.

Adding an architecture is one entry here (and its fixture spec in scripts/tiny_specs.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from model_checks import configured
from script_loader import load_script

from frink_cli.backends.cupy import eligibility
from frink_cli.backends.cupy.capabilities import CHUNKED
from frink_cli.model.config import ModelConfig
from frink_cli.model.weights import ModelWeights

# The fixture specs, as data: which fixtures record a greedy run, and how long.
TINY_SPECS = load_script("tiny_specs").SPECS

# The recurrent prefill chunk (the host scan's and metal's): a recurrent fixture's tokens
# and greedy prompt are longer, so its decode starts from a state carried across it.
PREFILL_CHUNK = 64
# Greedy references of the recurrent family: at least this many steps.
LONG_GREEDY = 24


@dataclass(frozen=True)
class Converter:
    """The HF directory read by frink against the GGUF llama.cpp's converter wrote.

    Every `<arch>.*` metadata key of the GGUF must be in the HF dir's metadata with the
    same value (floats approximately), but for keys ending in one of `skip_suffixes` (the
    converter writes a default there); `only_keys` (suffixes after `<arch>.`) narrows the
    check to those keys. Tensors: the same names and shapes, values equal, except tensors
    whose name ends in one of `ulp_suffixes` (rtol 2.5e-7: an exp NumPy and torch round
    apart) and, with `rel_tol`, any tensor within rel_tol * max(1, max|converter's|).
    `fixtures`: the fixtures checked (None: all of the entry's)."""

    skip_suffixes: tuple[str, ...] = ()
    only_keys: tuple[str, ...] = ()
    ulp_suffixes: tuple[str, ...] = ()
    rel_tol: float = 0.0
    fixtures: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Metal:
    """The metal backend (MLX; its CPU device on Linux) on these fixtures: both sources,
    batched and stepped, against both references with every layer taken (nothing refused,
    nothing failed); llama.cpp's decode steps after a batched prefill (and, `generate`,
    frink's greedy tokens too); and, for `per_token`, a prompt as one device submission
    and each decode token one more.

    `kinds`: the only submission kinds its ledger may show (empty: not checked).
    `chunked`: a batch of the fixture's tokens is one submission per 64-row chunk and a
    stepped run one per token. `state`: the cache fields (conv_state, delta_state, k, v)
    the device hands back to the host cache at commit, equal to the host body's after
    `state_run` = (tokens, of them prefilled as one batch, context) on `state_fixtures`, and
    so are the last logits; `state_in_every_layer`: every layer holds them."""

    fixtures: tuple[str, ...]
    per_token: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()
    generate: bool = False
    kinds: frozenset[str] = frozenset()
    chunked: bool = False
    state: tuple[str, ...] = ()
    state_fixtures: tuple[str, ...] = ()
    state_run: tuple[int, int, int] = (20, 16, 32)
    state_in_every_layer: bool = False


@dataclass(frozen=True)
class Cuda:
    """`load(path, backend="cuda")` with NumPy standing in for CuPy, batched and stepped,
    against both references; nothing failed. `refused`: every refusal carries this reason
    (the host body runs those layers); `every_layer`: every layer is refused for this reason
    and the device runs nothing; neither: the device ran and refused nothing.

    `emulated`: fixtures whose stack runs on kernels/*.cu on the CPU emulator over
    `emulated_run` = (tokens, 0: all; where the second prefill starts): a prefill, a prefill
    over the cached prefix and four decode steps give the host body's logits and both
    references', each run one submission with the lm head in it. `stack`: likewise with
    NumPy standing in for CuPy (all the tokens, the second prefill from token 17)."""

    fixtures: tuple[str, ...]
    refused: str | None = None
    every_layer: str = ""
    emulated: tuple[str, ...] = ()
    emulated_run: tuple[int, int] = (24, 9)
    stack: tuple[str, ...] = ()


LayerChange = Callable[[Any], Mapping[str, Any]]


@dataclass(frozen=True)
class Off:
    """How one decoration of `fixture` is switched off (or replaced by its nearest
    neighbour): `config` changes (each where it lives, core or architecture config; a
    function of the config where the new value is built from the old), `layer` a function
    of a layer's weights giving the fields to replace on it ({} leaves it as it is), and
    `model` the model-level weights replaced. Switched off, the logits must land far from
    both references, so parity cannot pass without the decoration."""

    name: str
    fixture: str
    config: Mapping[str, Any] | Callable[[ModelConfig], Mapping[str, Any]] = field(
        default_factory=dict
    )
    layer: LayerChange | None = None
    model: Mapping[str, Any] = field(default_factory=dict)


def switched_off(cfg: ModelConfig, w: ModelWeights, off: Off) -> tuple[ModelConfig, ModelWeights]:
    """The one way a decoration is switched off: (config, weights) with `off` applied."""
    changes = off.config(cfg) if callable(off.config) else off.config
    w = dataclasses.replace(w, **off.model)
    if off.layer is not None:
        change = off.layer
        w = dataclasses.replace(
            w, layers=[dataclasses.replace(lw, **change(lw)) for lw in w.layers]
        )
    return configured(cfg, **changes), w


def in_block(block: str, change: LayerChange) -> LayerChange:
    """A layer change inside one block's weights (lw.<block>: moe, mamba, shortconv, ...);
    layers without that block are left as they are."""

    def layer(lw: Any) -> Mapping[str, Any]:
        b = getattr(lw, block)
        return {} if b is None else {block: dataclasses.replace(b, **change(b))}

    return layer


def _zeros(name: str) -> LayerChange:
    return lambda b: {name: np.zeros_like(getattr(b, name))}


def _ones(name: str, scale: float = 1.0) -> LayerChange:
    return lambda b: {name: np.ones_like(getattr(b, name)) * scale}


def _no_bias(lin: Any) -> Any:
    return dataclasses.replace(lin, b=None)


def _identity_taps(sc: Any) -> Mapping[str, Any]:
    """A short conv whose kernel passes the current row through (no conv)."""
    taps = np.zeros_like(sc.conv)
    taps[:, -1] = 1.0
    return {"conv": taps}


def _router_ones(moe: Any) -> Mapping[str, Any]:
    """gemma4's router input scale off: ones over sqrt(width), the plain RMS norm."""
    return {"router_norm": np.ones_like(moe.router_norm) * moe.router_norm.shape[0] ** -0.5}


# --- deepseek2 (issue 31) -------------------------------------------------------------------
def _moe(**changes: Any) -> Callable[[ModelConfig], Mapping[str, Any]]:
    return lambda cfg: {"moe": dataclasses.replace(cfg.ext.moe, **changes)}


_DEEPSEEK2_OFF = (
    Off(
        "no yarn softmax mscale",
        "deepseek_v3",
        lambda cfg: {
            "mla": dataclasses.replace(cfg.ext.mla, scale=cfg.ext.mla.scale / cfg.ext.yarn_mscale)
        },
    ),
    Off("no yarn", "deepseek_v3", {"rope_scaling": None, "rope_scale": 1.0}),
    Off("no expert groups", "deepseek_v3", _moe(n_group=1, topk_group=1)),
    Off("no selection bias", "deepseek_v3", layer=in_block("moe", lambda m: {"probs_b": None})),
    Off("no routed scaling", "deepseek_v3", _moe(weights_scale=1.0)),
    Off("no renormalization", "deepseek_v3", _moe(norm_topk=False)),
    Off("softmax for sigmoid", "deepseek_v3", _moe(gating="softmax")),
    Off("no shared expert", "deepseek_v3", layer=in_block("moe", lambda m: {"down_shexp": None})),
    Off("no q_a norm", "deepseek_v3", layer=lambda lw: {"q_a_norm": np.ones_like(lw.q_a_norm)}),
    Off("no kv_a norm", "deepseek_v3", layer=lambda lw: {"kv_a_norm": np.ones_like(lw.kv_a_norm)}),
    Off("no routed scaling", "deepseek_v2_lite", _moe(weights_scale=1.0)),
    Off("sigmoid for softmax", "deepseek_v2_lite", _moe(gating="sigmoid")),
    Off(
        "no shared expert",
        "deepseek_v2_lite",
        layer=in_block("moe", lambda m: {"down_shexp": None}),
    ),
)


# --- mimo2 (issue 31) -----------------------------------------------------------------------
_MIMO2_OFF = (
    Off("attn_sinks", "mimo2", {"attn_sinks": ()}, lambda lw: {"attn_sinks": None}),
    Off("value_scale", "mimo2", {"value_scale": None}),
    Off("swa_rope_base", "mimo2", lambda cfg: {"rope_base_swa": cfg.rope_base}),
    Off("partial_rope", "mimo2", {"rope_dim": 24}),
    Off("sliding_window", "mimo2", {"sliding_window": None, "swa_layers": (False,) * 4}),
    Off("expert_bias", "mimo2", layer=in_block("moe", lambda m: {"probs_b": None})),
    Off("sigmoid_gating", "mimo2", _moe(gating="softmax")),
    Off("norm_topk", "mimo2", _moe(norm_topk=False)),
)


@dataclass(frozen=True)
class Arch:
    """One architecture's row of the conformance table.

    `fixtures`: its tiny fixtures. Every fixture is checked against transformers and
    llama.cpp (both sources, batched and stepped), stepped against batched and GGUF against
    HF dir. `greedy_min`: llama.cpp's greedy run (recorded for the fixtures whose spec asks
    for one) has at least this many steps and frink reproduces it from `greedy_sources`;
    `greedy_prompt_min` / `tokens_min`: the greedy prompt and the reference sequence are at
    least this long. `past_window`: the reference sequence runs more than 6 sliding windows.
    `refuses_truncation`: a cache holding the architecture's recurrent state refuses to
    truncate, with an error matching this; empty: the cache truncates anywhere.
    `decorations`: the decorations that can be switched off, each with how (see Off).
    `transformers_only`: fixtures whose settings llama.cpp does not read (it hard-codes
    them), checked against transformers by the architecture's own test file, not here."""

    arch: str
    fixtures: tuple[str, ...]
    greedy_min: int = 0
    greedy_sources: tuple[str, ...] = ("gguf", "hf")
    greedy_prompt_min: int = 1
    tokens_min: int = 0
    past_window: bool = False
    converter: Converter | None = None
    metal: Metal | None = None
    cuda: Cuda | None = None
    refuses_truncation: str = ""
    decorations: tuple[Off, ...] = ()
    transformers_only: tuple[str, ...] = ()

    def greedy_fixtures(self) -> tuple[str, ...]:
        """The fixtures whose greedy run is checked (their spec records one)."""
        if not self.greedy_min:
            return ()
        return tuple(f for f in self.fixtures if TINY_SPECS[f].greedy)


# --- the decorations each architecture can switch off ---------------------------------------------

_ONES_64 = np.ones(64, np.float32)  # the olmo2 fixture's width


def _olmo2_per_head(lw: Any) -> Mapping[str, Any]:
    """olmo2's full-width QK norm weights applied per head (one RMS per 16-wide head)."""
    return {"q_norm": lw.q_norm.reshape(-1, 16), "k_norm": lw.k_norm.reshape(-1, 16)}


_OLMO2_OFF = (
    # llama's pre-norms (weightless) where olmo2 has none.
    Off(
        "pre norms",
        "olmo2",
        {"no_pre_norm": False},
        lambda lw: {"attn_norm": _ONES_64, "ffn_norm": _ONES_64},
    ),
    Off(
        "no qk norm", "olmo2", {"qk_norm_full": False}, lambda lw: {"q_norm": None, "k_norm": None}
    ),
    Off("per-head qk norm", "olmo2", {"qk_norm_full": False, "qk_norm": True}, _olmo2_per_head),
    Off(
        "no post-attention norm",
        "olmo2",
        {"post_attn_norm": False},
        lambda lw: {"post_attn_norm": None},
    ),
    Off("no post-FFN norm", "olmo2", {"post_ffn_norm": False}, lambda lw: {"post_ffn_norm": None}),
)
_BITNET_OFF = (
    Off("no attn sub-norm", "bitnet", {"attn_sub_norm": False}, lambda lw: {"attn_sub_norm": None}),
    Off("no ffn sub-norm", "bitnet", {"ffn_sub_norm": False}, lambda lw: {"ffn_sub_norm": None}),
    # Weightless: the norms' own weights are read.
    Off("weightless attn sub-norm", "bitnet", layer=_ones("attn_sub_norm")),
    Off("weightless ffn sub-norm", "bitnet", layer=_ones("ffn_sub_norm")),
    # transformers' default activation, not the one llama.cpp runs.
    Off("gelu for silu", "bitnet", {"ffn_act": "gelu_tanh"}),
)


def _granite_off(fixture: str) -> tuple[Off, ...]:
    """Granite's four multipliers, each at its neutral value (q.k scale 1/sqrt(16))."""
    return (
        Off("embedding", fixture, {"embd_scale": None}),
        Off("residual", fixture, {"residual_scale": None}),
        Off("attention", fixture, {"attn_scale": 0.25}),
        Off("logits", fixture, {"logit_scale": None}),
    )


_GEMMA4_OFF = (
    Off("v_norm", "gemma4", {"v_norm": False}),
    Off("per_layer_embd", "gemma4", {"per_layer_embd": 0}),
    Off("layer_out_scale", "gemma4", {"layer_out_scale": False}, lambda lw: {"out_scale": None}),
    Off("proportional_rope", "gemma4", model={"rope_freqs": None}),
    Off("sliding_window", "gemma4", {"sliding_window": None}),
    Off("final_softcap", "gemma4", {"final_logit_softcap": None}),
    Off("attn_scale", "gemma4", {"attn_scale": 0.25}),
    # the MoE variant's own, and two it shares
    Off("v_norm", "gemma4_moe", {"v_norm": False}),
    Off(
        "layer_out_scale", "gemma4_moe", {"layer_out_scale": False}, lambda lw: {"out_scale": None}
    ),
    Off("router_scale", "gemma4_moe", layer=in_block("moe", _router_ones)),
    Off("expert_scale", "gemma4_moe", layer=in_block("moe", _ones("expert_scale"))),
    Off("experts_pre_norm", "gemma4_moe", layer=in_block("moe", _ones("pre_norm"))),
)
_GPT_OSS_OFF = (
    Off("sinks", "gpt_oss", {"attn_sinks": False}),
    Off("swa_rope_scale", "gpt_oss", {"swa_rope_scaled": False}),
    Off("sliding_window", "gpt_oss", {"sliding_window": None, "swa_layers": (False,) * 3}),
    Off("qkv_bias", "gpt_oss", layer=lambda lw: {"qkv": _no_bias(lw.qkv)}),
    Off("o_bias", "gpt_oss", layer=lambda lw: {"wo": _no_bias(lw.wo)}),
    Off("router_bias", "gpt_oss", layer=in_block("moe", lambda m: {"inp": _no_bias(m.inp)})),
    Off(
        "expert_gate_up_bias", "gpt_oss", layer=in_block("moe", lambda m: {"gate_up_exps_b": None})
    ),
    Off("expert_down_bias", "gpt_oss", layer=in_block("moe", lambda m: {"down_exps_b": None})),
)
# Llama 4 (the chunk and the temperature are switched off in tests/test_llama4.py, on
# llama4_chunked: llama.cpp's constants leave both idle on a 40-token sequence).
_LLAMA4_OFF = (
    Off("qk_l2_norm", "llama4", layer=lambda lw: {"q_norm": None, "k_norm": None}),
    Off("nope_layers", "llama4", {"no_rope_step": 0}),
    Off(
        "expert_weights_before",
        "llama4",
        lambda cfg: {"moe": dataclasses.replace(cfg.ext.moe, weights_before=False)},
    ),
    Off(
        "sigmoid_router",
        "llama4",
        lambda cfg: {"moe": dataclasses.replace(cfg.ext.moe, gating="softmax")},
    ),
    Off("shared_expert", "llama4", layer=in_block("moe", lambda m: {"down_shexp": None})),
)
_GRANITEHYBRID_OFF = (
    Off("no residual multiplier", "granitehybrid", {"residual_scale": None}),
    Off("no embedding multiplier", "granitehybrid_dense", {"embd_scale": None}),
    Off("no logit scale", "granitehybrid", {"logit_scale": None}),
    Off("default attention scale", "granitehybrid", {"attn_scale": 0.25}),
    Off("rope instead of NoPE", "granitehybrid", {"no_rope": False}),
)
_MAMBA_OFF = (
    Off(
        "no dt/B/C norms",
        "falcon_mamba",
        layer=in_block("mamba", lambda mw: {"dt_norm": None, "b_norm": None, "c_norm": None}),
    ),
    Off("no D skip", "mamba", layer=in_block("mamba", _zeros("d"))),
    Off("no conv bias", "mamba", layer=in_block("mamba", _zeros("conv_b"))),
)
_MAMBA2_OFF = (
    Off("no D skip", "mamba2", layer=in_block("mamba2", _zeros("d"))),
    Off("no conv bias", "mamba2", layer=in_block("mamba2", _zeros("conv_b"))),
    Off("no dt bias", "mamba2", layer=in_block("mamba2", _zeros("dt_bias"))),
    Off("no gated norm weight", "mamba2", layer=in_block("mamba2", _ones("norm"))),
)
_LFM2_OFF = (
    Off(
        "no QK norm",
        "lfm2",
        layer=lambda lw: {} if lw.q_norm is None else {"q_norm": None, "k_norm": None},
    ),
    Off("no conv (identity taps)", "lfm2", layer=in_block("shortconv", _identity_taps)),
)
_LFM2MOE_OFF = (
    Off("no expert bias", "lfm2moe", layer=in_block("moe", lambda m: {"probs_b": None})),
    Off(
        "softmax gating",
        "lfm2moe",
        lambda cfg: {"moe": dataclasses.replace(cfg.ext.moe, gating="softmax")},
    ),
)

# The recurrent family: tokens and greedy prompts past one prefill chunk, 24+ greedy steps.
_RECURRENT = dict(
    greedy_min=LONG_GREEDY,
    greedy_prompt_min=PREFILL_CHUNK + 1,
    tokens_min=PREFILL_CHUNK + 1,
)
_ULP_A = Converter(ulp_suffixes=(".ssm_a",))
# Hybrid converters write the default full_attention_interval even when layer_types differ.
# --- minimax-01 (issue 31) ------------------------------------------------------------------
_MINIMAX_OFF = (
    Off("no residual alpha", "minimax", {"residual_alpha": 1.0}),
    Off("no lightning output norm", "minimax", layer=lambda lw: _lightning(lw, _ones("norm"))),
    Off(
        "constant lightning output gate",
        "minimax",
        layer=lambda lw: _lightning(lw, lambda b: {"gate": _zero_linear(b.gate)}),
    ),
    Off("no decay", "minimax", lambda cfg: {"lightning": _no_decay(cfg.ext.lightning)}),
    Off("no renormalization", "minimax", _moe(norm_topk=False)),
)


def _lightning(lw: Any, change: LayerChange) -> Mapping[str, Any]:
    """A change inside a lightning layer's block (the softmax-attention layer, a plain
    LayerWeights, is left as it is)."""
    return in_block("lightning", change)(lw) if hasattr(lw, "lightning") else {}


def _zero_linear(lin: Any) -> Any:
    return dataclasses.replace(lin, w=np.zeros_like(lin.w))


def _no_decay(lc: Any) -> Any:
    """Lightning attention with every slope 0: plain linear attention."""

    class NoDecay(type(lc)):  # type: ignore[misc]
        def slopes(self, layer: int) -> tuple[float, ...]:
            return (0.0,) * self.n_head

    return NoDecay(lc.layers, lc.n_head, lc.head_dim)


_QWEN_HYBRID = Converter(skip_suffixes=(".full_attention_interval",), rel_tol=1e-6)
_MAMBA_RUN = frozenset({"mamba-run+lm-head"})
_ROLLBACK = "cannot be rolled back"
_MAMBA2_SCAN = "mamba2 selective scan"
# The first op the cuda stack does not implement in every mamba-family layer.
_NO_SCAN = "selective_scan: not implemented"

TABLE: tuple[Arch, ...] = (
    Arch(
        "minimax-01",
        ("minimax",),
        greedy_min=LONG_GREEDY,
        greedy_prompt_min=PREFILL_CHUNK + 1,
        tokens_min=PREFILL_CHUNK + 1,
        converter=Converter(skip_suffixes=(".attention.recurrent_layers",)),
        metal=Metal(
            ("minimax",),
            per_token=("minimax",),
            decode=("minimax",),
            generate=True,
            kinds=frozenset({"lightning-run+lm-head"}),
            state=("delta_state",),
            state_fixtures=("minimax",),
            state_run=(80, 72, 96),
        ),
        # Its MoE on every layer is what the cuda stack refuses first everywhere (the
        # lightning op by name too: tests/test_minimax.py).
        cuda=Cuda(("minimax",), every_layer="route: not implemented"),
        refuses_truncation=_ROLLBACK,
        decorations=_MINIMAX_OFF,
    ),
    Arch(
        "llama",
        ("llama", "llama_q", "llama_tied", "mistral", "llama_yarn"),
        metal=Metal(("llama_yarn",)),
        cuda=Cuda(("llama_yarn",), emulated=("llama_yarn",), emulated_run=(0, 40)),
    ),
    Arch("qwen2", ("qwen2",)),
    Arch(
        "qwen3",
        ("qwen3", "qwen3_q", "qwen3_yarn"),
        metal=Metal(("qwen3_yarn",)),
        cuda=Cuda(("qwen3_yarn",), emulated=("qwen3_yarn",), emulated_run=(0, 40)),
    ),
    Arch("gemma3", ("gemma3_text", "gemma3")),
    Arch(
        "phi3",
        ("phi3", "phi3_longrope"),
        metal=Metal(("phi3", "phi3_longrope")),
        cuda=Cuda(("phi3", "phi3_longrope"), emulated=("phi3_longrope",), emulated_run=(0, 40)),
    ),
    Arch(
        "starcoder2",
        ("starcoder2",),
        metal=Metal(("starcoder2",), per_token=("starcoder2",)),
        cuda=Cuda(("starcoder2",)),
    ),
    Arch("bloom", ("bloom",), metal=Metal(("bloom",), per_token=("bloom",)), cuda=Cuda(("bloom",))),
    Arch("mpt", ("mpt",), metal=Metal(("mpt",), per_token=("mpt",)), cuda=Cuda(("mpt",))),
    Arch(
        "olmo2",
        ("olmo2",),
        greedy_min=1,
        converter=Converter(),
        metal=Metal(("olmo2",), per_token=("olmo2",), decode=("olmo2",)),
        cuda=Cuda(("olmo2",), emulated=("olmo2",), stack=("olmo2",)),
        decorations=_OLMO2_OFF,
    ),
    Arch(
        "bitnet",
        ("bitnet",),
        converter=Converter(),
        metal=Metal(("bitnet",), per_token=("bitnet",)),
        cuda=Cuda(("bitnet",), emulated=("bitnet",), emulated_run=(16, 6)),
        decorations=_BITNET_OFF,
    ),
    Arch(
        "granite",
        ("granite",),
        greedy_min=1,
        converter=Converter(rel_tol=1e-6),
        metal=Metal(("granite",), per_token=("granite",), decode=("granite",)),
        cuda=Cuda(("granite",), emulated=("granite",), stack=("granite",)),
        decorations=_granite_off("granite"),
    ),
    Arch(
        "granitemoe",
        ("granitemoe", "granitemoeshared"),
        greedy_min=1,
        converter=Converter(rel_tol=1e-6),
        metal=Metal(
            ("granitemoe", "granitemoeshared"),
            per_token=("granitemoe", "granitemoeshared"),
            decode=("granitemoe", "granitemoeshared"),
        ),
        cuda=Cuda(("granitemoe", "granitemoeshared"), refused=eligibility.MOE),
        decorations=_granite_off("granitemoe") + _granite_off("granitemoeshared"),
    ),
    Arch(
        "gemma4",
        ("gemma4", "gemma4_moe", "gemma4_mm"),
        greedy_min=LONG_GREEDY,
        past_window=True,
        converter=Converter(),
        metal=Metal(
            ("gemma4", "gemma4_moe", "gemma4_mm"),
            per_token=("gemma4", "gemma4_moe", "gemma4_mm"),
            decode=("gemma4", "gemma4_moe", "gemma4_mm"),
        ),
        decorations=_GEMMA4_OFF,
    ),
    Arch(
        "gpt-oss",
        ("gpt_oss",),
        greedy_min=LONG_GREEDY,
        past_window=True,
        converter=Converter(),
        metal=Metal(("gpt_oss",), per_token=("gpt_oss",), decode=("gpt_oss",)),
        decorations=_GPT_OSS_OFF,
    ),
    Arch(
        "qwen35",
        ("qwen35", "qwen35_vl"),
        greedy_min=1,
        greedy_sources=("gguf",),
        converter=_QWEN_HYBRID,
        refuses_truncation=_ROLLBACK,
    ),
    Arch(
        "qwen3next",
        ("qwen3next",),
        greedy_min=1,
        greedy_sources=("gguf",),
        converter=_QWEN_HYBRID,
        refuses_truncation=_ROLLBACK,
    ),
    Arch(
        "llama4",
        ("llama4",),
        greedy_min=LONG_GREEDY,
        converter=Converter(),
        metal=Metal(("llama4",), per_token=("llama4",), decode=("llama4",), generate=True),
        cuda=Cuda(("llama4",), every_layer="attention: " + CHUNKED),
        decorations=_LLAMA4_OFF,
        transformers_only=("llama4_chunked",),
    ),
    Arch("qwen3moe", ("qwen3moe",), greedy_min=1, converter=_QWEN_HYBRID),
    Arch(
        "qwen35moe",
        ("qwen35moe", "qwen35moe_vl"),
        greedy_min=1,
        converter=_QWEN_HYBRID,
        refuses_truncation=_ROLLBACK,
    ),
    Arch(
        "mamba",
        ("mamba", "falcon_mamba"),
        greedy_min=LONG_GREEDY,
        greedy_prompt_min=PREFILL_CHUNK + 1,
        converter=_ULP_A,
        cuda=Cuda(("mamba",), every_layer=_NO_SCAN),
        metal=Metal(
            ("mamba", "falcon_mamba"),
            per_token=("mamba", "falcon_mamba"),
            decode=("mamba", "falcon_mamba"),
            generate=True,
            kinds=_MAMBA_RUN,
            state=("delta_state", "conv_state"),
            state_fixtures=("mamba",),
            state_in_every_layer=True,
        ),
        refuses_truncation="mamba selective scan",
        decorations=_MAMBA_OFF,
    ),
    Arch(
        "mamba2",
        ("mamba2",),
        **_RECURRENT,
        converter=_ULP_A,
        cuda=Cuda(("mamba2",), every_layer=_NO_SCAN),
        metal=Metal(
            ("mamba2",),
            per_token=("mamba2",),
            decode=("mamba2",),
            generate=True,
            kinds=_MAMBA_RUN,
            state=("delta_state", "conv_state"),
            state_fixtures=("mamba2",),
            state_run=(80, 72, 96),
            state_in_every_layer=True,
        ),
        refuses_truncation=_MAMBA2_SCAN,
        decorations=_MAMBA2_OFF,
    ),
    Arch(
        "lfm2",
        ("lfm2",),
        **_RECURRENT,
        converter=Converter(),
        metal=Metal(
            ("lfm2",),
            per_token=("lfm2",),
            decode=("lfm2",),
            generate=True,
            kinds=frozenset({"shortconv-run+lm-head"}),
            chunked=True,
            state=("conv_state",),
            state_fixtures=("lfm2",),
        ),
        refuses_truncation="short conv",
        decorations=_LFM2_OFF,
    ),
    Arch(
        "lfm2moe",
        ("lfm2moe",),
        **_RECURRENT,
        converter=Converter(),
        metal=Metal(
            ("lfm2moe",),
            per_token=("lfm2moe",),
            decode=("lfm2moe",),
            generate=True,
            kinds=frozenset({"shortconv-run+lm-head"}),
            chunked=True,
            state=("conv_state",),
            state_fixtures=("lfm2moe",),
        ),
        refuses_truncation="short conv",
        decorations=_LFM2MOE_OFF,
    ),
    Arch(
        "granitehybrid",
        ("granitehybrid", "granitehybrid_dense"),
        **_RECURRENT,
        converter=Converter(
            ulp_suffixes=(".ssm_a",),
            only_keys=(
                "attention.head_count_kv",
                "rope.scaling.finetuned",
                "context_length",
                "ssm.conv_kernel",
                "ssm.inner_size",
                "ssm.state_size",
                "ssm.time_step_rank",
                "ssm.group_count",
                "embedding_scale",
                "residual_scale",
                "attention.scale",
                "logit_scale",
            ),
        ),
        metal=Metal(
            ("granitehybrid", "granitehybrid_dense"),
            per_token=("granitehybrid", "granitehybrid_dense"),
            decode=("granitehybrid", "granitehybrid_dense"),
            generate=True,
            kinds=_MAMBA_RUN,
            state=("delta_state", "conv_state"),
            state_fixtures=("granitehybrid",),
            state_run=(80, 72, 96),
        ),
        refuses_truncation=_MAMBA2_SCAN,
        decorations=_GRANITEHYBRID_OFF,
    ),
    Arch(
        "falcon-h1",
        ("falcon_h1", "falcon_h1_norm"),
        **_RECURRENT,
        cuda=Cuda(("falcon_h1",), every_layer=_NO_SCAN),
        converter=Converter(ulp_suffixes=(".ssm_a",)),
        metal=Metal(
            ("falcon_h1", "falcon_h1_norm"),
            per_token=("falcon_h1",),
            decode=("falcon_h1", "falcon_h1_norm"),
            generate=True,
            kinds=_MAMBA_RUN,
            state=("delta_state", "conv_state", "k", "v"),
            state_fixtures=("falcon_h1",),
            state_run=(80, 72, 96),
            state_in_every_layer=True,
        ),
        refuses_truncation=_MAMBA2_SCAN,
    ),
    # deepseek2 (issue 31)
    Arch(
        "deepseek2",
        ("deepseek_v3", "deepseek_v2_lite"),
        greedy_min=LONG_GREEDY,
        converter=Converter(),
        cuda=Cuda(("deepseek_v3",), every_layer="head_matmul: not implemented"),
        metal=Metal(
            ("deepseek_v3", "deepseek_v2_lite"),
            per_token=("deepseek_v3", "deepseek_v2_lite"),
            decode=("deepseek_v3", "deepseek_v2_lite"),
            generate=True,
            state=("k",),
            state_fixtures=("deepseek_v3",),
            state_in_every_layer=True,
        ),
        decorations=_DEEPSEEK2_OFF,
    ),
    # mimo2 (issue 31)
    Arch(
        "mimo2",
        ("mimo2",),
        greedy_min=LONG_GREEDY,
        past_window=True,
        converter=Converter(),
        metal=Metal(("mimo2",), per_token=("mimo2",), decode=("mimo2",), generate=True),
        cuda=Cuda(("mimo2",), every_layer="attention: K/V widths differ"),
        decorations=_MIMO2_OFF,
    ),
)
