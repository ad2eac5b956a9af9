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

from dataclasses import dataclass, field

from script_loader import load_script

from frink_cli.backends.cupy import eligibility

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
    stepped run one per token."""

    fixtures: tuple[str, ...]
    per_token: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()
    generate: bool = False
    kinds: frozenset[str] = frozenset()
    chunked: bool = False


@dataclass(frozen=True)
class Cuda:
    """`load(path, backend="cuda")` with NumPy standing in for CuPy, batched and stepped,
    against both references; nothing failed. `refused`: every refusal carries this reason
    (the host body runs those layers); None: the device ran and refused nothing."""

    fixtures: tuple[str, ...]
    refused: str | None = None


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
    truncate, with an error matching this; empty: the cache truncates anywhere."""

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
    notes: str = field(default="", compare=False)

    def greedy_fixtures(self) -> tuple[str, ...]:
        """The fixtures whose greedy run is checked (their spec records one)."""
        if not self.greedy_min:
            return ()
        return tuple(f for f in self.fixtures if TINY_SPECS[f].greedy)


# The recurrent family: tokens and greedy prompts past one prefill chunk, 24+ greedy steps.
_RECURRENT = dict(
    greedy_min=LONG_GREEDY,
    greedy_prompt_min=PREFILL_CHUNK + 1,
    tokens_min=PREFILL_CHUNK + 1,
)
_ULP_A = Converter(ulp_suffixes=(".ssm_a",))
# Hybrid converters write the default full_attention_interval even when layer_types differ.
_QWEN_HYBRID = Converter(skip_suffixes=(".full_attention_interval",), rel_tol=1e-6)
_MAMBA_RUN = frozenset({"mamba-run+lm-head"})
_ROLLBACK = "cannot be rolled back"
_MAMBA2_SCAN = "mamba2 selective scan"

TABLE: tuple[Arch, ...] = (
    Arch(
        "llama",
        ("llama", "llama_q", "llama_tied", "mistral", "llama_yarn"),
        metal=Metal(("llama_yarn",)),
        cuda=Cuda(("llama_yarn",)),
    ),
    Arch("qwen2", ("qwen2",)),
    Arch(
        "qwen3",
        ("qwen3", "qwen3_q", "qwen3_yarn"),
        metal=Metal(("qwen3_yarn",)),
        cuda=Cuda(("qwen3_yarn",)),
    ),
    Arch("gemma3", ("gemma3_text", "gemma3")),
    Arch(
        "phi3",
        ("phi3", "phi3_longrope"),
        metal=Metal(("phi3", "phi3_longrope")),
        cuda=Cuda(("phi3", "phi3_longrope")),
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
        cuda=Cuda(("olmo2",)),
    ),
    Arch(
        "bitnet",
        ("bitnet",),
        converter=Converter(),
        metal=Metal(("bitnet",), per_token=("bitnet",)),
        cuda=Cuda(("bitnet",)),
    ),
    Arch(
        "granite",
        ("granite",),
        greedy_min=1,
        converter=Converter(rel_tol=1e-6),
        metal=Metal(("granite",), per_token=("granite",), decode=("granite",)),
        cuda=Cuda(("granite",)),
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
    ),
    Arch(
        "gpt-oss",
        ("gpt_oss",),
        greedy_min=LONG_GREEDY,
        past_window=True,
        converter=Converter(),
        metal=Metal(("gpt_oss",), per_token=("gpt_oss",), decode=("gpt_oss",)),
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
        metal=Metal(
            ("mamba", "falcon_mamba"),
            per_token=("mamba", "falcon_mamba"),
            decode=("mamba", "falcon_mamba"),
            generate=True,
            kinds=_MAMBA_RUN,
        ),
        refuses_truncation="mamba selective scan",
    ),
    Arch(
        "mamba2",
        ("mamba2",),
        **_RECURRENT,
        converter=_ULP_A,
        metal=Metal(
            ("mamba2",), per_token=("mamba2",), decode=("mamba2",), generate=True, kinds=_MAMBA_RUN
        ),
        refuses_truncation=_MAMBA2_SCAN,
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
        ),
        refuses_truncation="short conv",
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
        ),
        refuses_truncation="short conv",
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
        ),
        refuses_truncation=_MAMBA2_SCAN,
    ),
    Arch(
        "falcon-h1",
        ("falcon_h1", "falcon_h1_norm"),
        **_RECURRENT,
        converter=Converter(ulp_suffixes=(".ssm_a",)),
        metal=Metal(
            ("falcon_h1", "falcon_h1_norm"),
            per_token=("falcon_h1",),
            decode=("falcon_h1", "falcon_h1_norm"),
            generate=True,
            kinds=_MAMBA_RUN,
        ),
        refuses_truncation=_MAMBA2_SCAN,
    ),
)
