"""Host kernels for weights kept in the GGUF file's own quantized blocks (kernels.py)."""
