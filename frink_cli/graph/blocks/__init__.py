"""The block library: the pieces a layer is built from, each a function of `Ops`, the
block's weights and a small typed block config (never the model's whole config).

    step.py       a step's per-sequence dispatch (each_sequence) over batched slots
    norms.py      RMSNorm or LayerNorm, and the optional norms on a branch
    attention.py  grouped-query attention with its variants (AttentionSpec)
    ffn.py        the gated and the plain FFN
    moe.py        the routed experts with an optional shared expert (MoeConfig)
    gdn.py        the gated delta net (GdnConfig)
    mamba.py      Mamba-1 and Mamba-2 selective-scan mixers (MambaConfig)
    shortconv.py  the gated short convolution (ShortConvConfig)

An architecture (frink_cli/archs) composes its layer from these; the backends implement
the ops underneath. Nothing here names an architecture.
"""
