"""ModelConfig: the core every model has (sizes, rope, attention window), and the
ArchConfig hooks through which the generic code asks an architecture what it adds.

An architecture's own fields (its decorations, its block configs) live in its ArchConfig
subclass in frink_cli/archs/, filled from the GGUF keys by its module. `layer_shape(l)`
says what layer l is, so the host body, the caches and every backend ask one place.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .reader import TensorReader


@dataclass(frozen=True)
class LayerShape:
    """What layer l is: its blocks, window, rope and sizes. The caches, the rope tables and
    the backends size themselves from this alone."""

    # The mixer block: "attention" | "gdn" (gated delta net) | "lightning" (linear
    # attention with a decay) | "mamba" | "mamba2" | "shortconv" | "attention+mamba2" (both side
    # by side on the same normed rows) |
    # "linear" (only the output projection, on the normed rows) | "none" (no mixer branch)
    mixer: str
    # "dense" | "moe" (sparse mixture of experts) | "dense+moe" (both side by side) |
    # "none" (no FFN branch)
    ffn: str
    window: int | None  # sliding-window width (keys q - k < window are visible), None = full
    rope_base: float
    rope_scale: float  # position multiplier (1 / linear scaling factor)
    # This layer's sizes: the model's own, or its per-layer ones (ModelConfig.layer_sizes).
    # A layer without attention has n_head_kv 0 (its KV slot holds nothing).
    n_head: int
    n_head_kv: int
    n_ff: int
    # This layer's head widths and rotated dims (the model's, unless its kind has its own).
    head_dim_k: int = 0
    head_dim_v: int = 0
    rope_dim: int = 0
    # The model's rope_freqs do not apply to this layer.
    no_rope_freqs: bool = False
    # KV sharing: this layer computes no K/V of its own and attends over the rows layer
    # kv_source wrote for this step and before (None: its own K/V).
    kv_source: int | None = None
    index: int = 0  # the layer's place in the stack
    # Chunked local attention: the query at p sees only the keys of its own chunk,
    # positions [p // chunk * chunk, p] (None: no chunks).
    chunk: int | None = None


@dataclass(frozen=True)
class RopeScaling:
    """YaRN or LongRoPE, as llama.cpp applies them (ggml's rope_yarn; graph/rope.py's
    `rope_frequencies` turns this into per-pair frequencies and a cos/sin multiplier).

    kind "yarn": ext_factor 1 blends interpolated (position * 1/factor) and extrapolated
    angles per pair over the ramp between the beta_fast/beta_slow correction dims, and cos/sin
    are multiplied by get_mscale(factor) = 1 + 0.1 ln(factor) (times attn_factor).
    kind "longrope": per-pair frequency divisors, the long ones when the context is
    longer than orig_ctx (llama.cpp's n_ctx_seq > n_ctx_orig_yarn), else the short ones;
    cos/sin multiplied by attn_factor. kind "attn" : only attn_factor (rope.scaling.attn_factor
    on a model with no other scaling)."""

    kind: str  # "yarn" | "longrope" | "attn"
    factor: float  # the model's rope.scaling.factor (1 if none)
    orig_ctx: int  # rope.scaling.original_context_length (llama.cpp's n_ctx_orig_yarn)
    ext_factor: float = 0.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attn_factor: float = 1.0  # rope.scaling.attn_factor: multiplies cos and sin

    def long(self, n_ctx: int) -> bool:
        """LongRoPE's switch: the long factors for a context beyond the original one."""
        return self.kind == "longrope" and n_ctx > self.orig_ctx


@dataclass(frozen=True)
class LayerSizes:
    """Per-layer head counts and FFN widths (llama.cpp's n_head_arr,
    n_head_kv_arr, n_ff_arr from array-valued GGUF keys). Present only when they vary;
    ModelConfig's n_head / n_head_kv / n_ff then hold the largest of each, and every
    per-layer reader (the composition, the weights, the caches, the backends) asks
    layer_shape(l).

    Zero entries, as llama.cpp reads them: n_head 0 is an attention-free
    layer (mixer "none"), n_head > 0 with n_head_kv 0 a "linear attention" layer (mixer
    "linear": wo on the normed input), n_ff 0 an FFN-free layer (ffn "none")."""

    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    n_ff: tuple[int, ...]


@dataclass(frozen=True)
class LayerPlan:
    """Which of a layer's tensors its architecture reads, in block terms (the weights
    loader follows it; ArchConfig.layer_plan makes it)."""

    pre_norms: bool = True  # attn_norm / ffn_norm (False: each branch reads x itself)
    ffn_norm: str = "ffn_norm"  # the pre-FFN norm's tensor name
    norm_biases: bool = False  # LayerNorms: each norm's .bias where the file has one
    weightless: bool = False  # the norms have no tensors: ones
    post_attn_norm: bool = False  # post_attention_norm required (else read if present)
    post_ffn_norm: bool = False  # post_ffw_norm required (else read if present)
    q_gate: bool = False  # the query rows carry an output gate per head
    # The QK norms: "" (read if present), "head" (required, per head), "heads" (required,
    # per head with each head's own weights, [n_head, hd]), "full" (required, over the
    # whole projection width, with biases when norm_biases) or "weightless".
    qk_norm: str = ""
    sub_norms: bool = False  # attn_sub_norm and ffn_sub_norm
    sinks: bool = False  # attn_sinks
    q_gain: bool = False  # attn_q_norm as a per-head gain [n_head, 1]
    proj_scales: bool = False  # attn_output.scale and ffn_down.scale
    plain_ffn: bool = False  # ffn_up + ffn_down, no gate
    v_from_k: bool = False  # no V projection


@dataclass(frozen=True)
class HeadPlan:
    """Which of the head's and embedding's tensors an architecture reads."""

    output_norm: str = "output_norm"  # the final norm's tensor name
    norm_biases: bool = False  # output_norm.bias where the file has it
    weightless: bool = False  # the final norm is ones
    # A norm on the looked-up embeddings: "" none, "layer_norm" (token_embd_norm with its
    # bias), "ones" (weightless).
    embd_norm: str = ""


@dataclass(frozen=True)
class ArchConfig:
    """What an architecture adds to the core: its own fields (a frozen dataclass subclass
    in its module under frink_cli/archs) and its behaviour, asked through these hooks by
    the host body, the caches and the backends, which never name an architecture.

    The base is a plain pre-norm attention stack's geometry; `layer`, `embed` and `head`
    are the architecture's composition over `Ops` (graph/ops.py), written in its module
    from the block library (graph/blocks)."""

    def layer_shape(self, cfg: ModelConfig, layer: int) -> LayerShape:
        """What layer `layer` is: attention ("none" with 0 heads, "linear" with 0 KV heads)
        and a dense FFN ("none" where a per-layer FFN width is 0), its sliding window,
        rope and head widths."""
        swa = cfg.swa_layers[layer]
        n_head, n_head_kv, n_ff = cfg.n_head, cfg.n_head_kv, cfg.n_ff
        if cfg.layer_sizes is not None:
            s = cfg.layer_sizes
            n_head, n_head_kv, n_ff = s.n_head[layer], s.n_head_kv[layer], s.n_ff[layer]
        if n_head == 0:
            mixer, n_head_kv = "none", 0
        elif n_head_kv == 0:
            mixer = "linear"
        else:
            mixer = "attention"
        ffn = "none" if n_ff == 0 and cfg.layer_sizes is not None else "dense"
        return LayerShape(
            mixer=mixer,
            ffn=ffn,
            window=cfg.sliding_window if swa else None,
            rope_base=cfg.rope_base_swa if swa else cfg.rope_base,
            rope_scale=1.0 if swa else cfg.rope_scale,
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_ff=n_ff,
            head_dim_k=cfg.head_dim_k,
            head_dim_v=cfg.head_dim_v,
            rope_dim=cfg.rope_dim,
            kv_source=self.kv_source(cfg, layer),
            index=layer,
        )

    def is_recurrent(self, cfg: ModelConfig, layer: int) -> bool:
        """The layer keeps a recurrent state (conv tail + state) instead of K/V rows."""
        return False

    def recurrent_shapes(
        self, cfg: ModelConfig, layer: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv tail shape, state shape) of a recurrent layer's state (cache.RecurrentState)."""
        raise ValueError(f"layer {layer} keeps no recurrent state")

    def recurrent_state_bytes(self, cfg: ModelConfig) -> int:
        """f32 bytes of recurrent state one sequence holds over all layers."""
        return 0

    def residual_width(self, cfg: ModelConfig) -> int:
        """Columns of the rows passed between layers: n_embd, or more where a side stream
        rides beside the residual stream."""
        return cfg.n_embd

    def kv_source(self, cfg: ModelConfig, layer: int) -> int | None:
        """The layer whose K/V rows a KV-sharing layer attends over (None: its own)."""
        return None

    def decorations(self) -> dict[str, Any]:
        """The architecture's fields this model sets (truthy, and not their default), by
        name: what `frink info` lists as its decorations."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value and value != f.default:
                out[f.name] = value
        return out

    def info(self) -> dict[str, Any]:
        """The architecture's block configs for `frink info --json`, by section name."""
        return {}

    def embeds_only(self) -> bool:
        """The model has no LM head: its last layer's rows are pooled into embeddings (an
        encoder), never turned into logits."""
        return False

    def attends(self, cfg: ModelConfig) -> bool:
        """Some layer has attention heads (validate_config checks their counts)."""
        return True

    def positive_values(self) -> list[tuple[str, float | None]]:
        """The architecture's optional numbers that must be finite and > 0 when set, by
        what they are (validate_config refuses the rest by that name)."""
        return []

    def matrix_rows(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        """Each weight matrix's rows the config implies (times n_embd columns), by name:
        validate_config refuses one larger than any tensor of the file before anything is
        allocated from it."""
        return [
            ("feed_forward_length", cfg.n_ff),
            ("query width", cfg.n_head * cfg.head_dim_k),
            ("key/value width", cfg.n_head_kv * max(cfg.head_dim_k, cfg.head_dim_v)),
        ]

    # --- the weights: what the loader reads for this architecture --------------------
    def layer_plan(self, cfg: ModelConfig, shape: LayerShape) -> LayerPlan:
        """Which of layer shape.index's tensors exist, in block terms."""
        return LayerPlan()

    def head_plan(self, cfg: ModelConfig) -> HeadPlan:
        return HeadPlan()

    def read_layer(self, r: TensorReader, cfg: ModelConfig, layer: int, base: Any) -> Any:
        """The layer's weights: `base` (the blocks' LayerWeights, as the plan said) with
        the architecture's own tensors added (a LayerWeights subclass of its module)."""
        return base

    def read_mixer(self, r: TensorReader, cfg: ModelConfig, shape: LayerShape, p: str) -> Any:
        """The weights of layer p's mixer block where the architecture stores them its own
        way (given to the block under the mixer's name), or None: the block library's reader."""
        return None

    def read_head(self, r: TensorReader, cfg: ModelConfig) -> Any:
        """The architecture's own head tensors (ModelWeights.arch), or None."""
        return None

    def pooled_dense(self, head: Any) -> list[Any]:
        """The matrices [out, in] a GGUF embedding model applies, in order and without
        bias or activation, to its pooled rows (llama.cpp's dense_2 / dense_3), from
        read_head's result; none by default."""
        return []

    def block(self, name: str) -> Any:
        """The architecture's config of block `name` ("gdn", "mamba", "moe", ...), which a
        layer of that block's kind needs."""
        value = getattr(self, name, None)
        if value is None:
            raise ValueError(f"{type(self).__name__} has no {name} block config")
        return value

    # --- the composition (archs/): Ops, weights and rows in, rows out -----------------
    def embed(self, ops: Any, cfg: ModelConfig, w: Any, x: Any, lookup: Any) -> Any:
        """The looked-up embedding rows x [T, n_embd] (ours to overwrite) -> the rows the
        first layer reads [T, residual_width]. lookup(table) gives the step's rows of
        another per-token table; lookup(table, by_position=True) the rows at the step's
        positions (a learned position table)."""
        raise NotImplementedError

    def layer(
        self,
        ops: Any,
        cfg: ModelConfig,
        shape: LayerShape,
        w: Any,
        x: Any,
        pos: Any,
        kv: Any,
        rope: Any,
    ) -> Any:
        """x [T, residual_width] (left as it was) -> the layer's output rows."""
        raise NotImplementedError

    def final_norm(
        self, ops: Any, cfg: ModelConfig, output_norm: Any, x: Any, output_norm_b: Any
    ) -> Any:
        """The last layer's rows -> the rows [T, n_embd] the head reads (its final norm):
        what a decoder's embeddings pool, as llama.cpp pools them. An encoder's rows are
        its embeddings' input as they are."""
        raise NotImplementedError

    def head(
        self,
        ops: Any,
        cfg: ModelConfig,
        output_norm: Any,
        output: Any,
        x: Any,
        output_norm_b: Any = None,
    ) -> Any:
        """The last layer's rows -> logits [T, n_vocab], over the output norm and matrix
        as the backend holds them."""
        raise NotImplementedError


@dataclass(frozen=True)
class ModelConfig:
    """The core every model has, and `ext`: the architecture's own config (its fields and
    its layer), which the generic code reaches only through ArchConfig's hooks."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    rope_type: str  # "norm" (adjacent pairs, llama) | "neox" (halves)
    rope_dim: int  # leading dims of each head that rotate
    rope_base: float
    rope_scale: float
    rope_base_swa: float
    attn_scale: float  # multiplies q before q.k
    sliding_window: int | None
    swa_layers: tuple[bool, ...]
    ffn_act: str  # "silu" | "gelu_tanh" | "swiglu_oai"
    tied_embeddings: bool
    has_rope_freqs: bool  # per-dimension frequency factors ("rope_freqs.weight")
    ext: ArchConfig
    # YaRN / LongRoPE / an attention factor on cos and sin (None: plain or linear rope).
    rope_scaling: RopeScaling | None = None
    # Per-layer head counts and FFN widths; None when every layer has the model's
    # n_head / n_head_kv / n_ff.
    layer_sizes: LayerSizes | None = None

    @property
    def residual_width(self) -> int:
        """Columns of the rows passed between layers (ArchConfig.residual_width)."""
        return self.ext.residual_width(self)

    def kv_source(self, layer: int) -> int | None:
        return self.ext.kv_source(self, layer)

    def is_recurrent(self, layer: int) -> bool:
        return self.ext.is_recurrent(self, layer)

    def recurrent_state_bytes(self) -> int:
        return self.ext.recurrent_state_bytes(self)

    def recurrent_shapes(self, layer: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.ext.recurrent_shapes(self, layer)

    def decorations(self) -> dict[str, Any]:
        """Every decoration this model uses beyond the plain pre-norm llama layer, by name
        (the architecture's own, and the core's optional rope and window choices)."""
        out = {
            name: getattr(self, name)
            for name in ("sliding_window", "has_rope_freqs", "rope_scaling", "layer_sizes")
            if getattr(self, name)
        }
        return {**out, **self.ext.decorations()}

    def features(self) -> set[str]:
        """The names of decorations()."""
        return set(self.decorations())

    def layer_shape(self, layer: int) -> LayerShape:
        return self.ext.layer_shape(self, layer)

    def _layer_name(self, layer: int) -> str:
        """The layer's kind in layer_pattern: GDN, SWA, ATTN, LINEAR (wo only) or NONE (no
        attention); with per-layer sizes the heads, KV heads and FFN width ride along
        ("ATTN 12/3 ff768", "NONE ff0") so the pattern shows how the stack is shaped."""
        shape = self.layer_shape(layer)
        names = {
            "gdn": "GDN",
            "mamba": "MAMBA",
            "shortconv": "CONV",
            "mamba2": "MAMBA2",
            "attention+mamba2": "ATTN+MAMBA2",
            "none": "NONE",
            "linear": "LINEAR",
            "lightning": "LIGHTNING",
        }
        name = names.get(shape.mixer) or ("SWA" if self.swa_layers[layer] else "ATTN")
        if self.layer_sizes is None:
            return name
        heads = f" {shape.n_head}/{shape.n_head_kv}" if shape.mixer == "attention" else ""
        return f"{name}{heads} ff{shape.n_ff}"

    def layer_pattern(self) -> str:
        """A compact summary such as 'SWA x5 ATTN x1 (x3)' or 'GDN x3 ATTN x1 (x6)'."""
        names = [self._layer_name(i) for i in range(self.n_layer)]
        runs: list[tuple[str, int]] = []
        for n in names:
            if runs and runs[-1][0] == n:
                runs[-1] = (n, runs[-1][1] + 1)
            else:
                runs.append((n, 1))
        # The shortest group of runs that repeats to make the whole stack, shown once.
        for period in range(1, len(runs)):
            if len(runs) % period == 0 and runs == runs[:period] * (len(runs) // period):
                group = " ".join(f"{n} x{c}" for n, c in runs[:period])
                return f"{group} (x{len(runs) // period})"
        return " ".join(f"{n} x{c}" for n, c in runs)
