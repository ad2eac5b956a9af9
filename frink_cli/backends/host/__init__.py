"""The host backend: the Ops interface (graph/ops.py) in NumPy, the reference every other
backend is checked against, and the host body that runs the composed layers over it.

ops.py holds HostOps and HOST_OPS; the NumPy kernels behind them are attention.py
(blocked causal attention and its masks), gdn.py (the gated delta rule), ssm.py (the
selective scan), norms.py, rope.py (the host's rope tables), ffn.py (gated activations),
moe.py (routing), linear.py (the products and their thread choices) and rowwise.py with
rowwise.c (the row-wise ops in C, module _rowwise); body.py is HostBody. This package
imports nothing at import time, so each module can be imported alone.
"""
