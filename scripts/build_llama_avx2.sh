#!/bin/sh
# An AVX2-only llama-cpp-python (no AVX-512, VNNI or AMX), for like-with-like ratios on a
# machine whose native llama.cpp would use them (issue 30: users run AVX2 machines); with
# `vnni`, AVX2 plus AVX-VNNI (llama.cpp's "alderlake" level: Intel client CPUs), against
# frink's avxvnni variant:
#
#     scripts/build_llama_avx2.sh [DIR] [vnni]  # default: build/llama_avx2 (~5 min, 2 cores)
#     FRINK_NATIVE_ISA=avx2 PYTHONPATH=DIR frink bench MODEL --compare llama.cpp
#
# The version is the one the test venv pins; its system info should say AVX2 and no AVX512
# (and AVX_VNNI = 1 with `vnni`):
#     PYTHONPATH=DIR python -c "import llama_cpp; print(llama_cpp.llama_print_system_info())"
set -eu
DIR=${1:-build/llama_avx2}
PY=${PY:-.venv/bin/python}
VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
OFF="AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16 AMX_TILE AMX_INT8 AMX_BF16"
ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
if [ "${2:-}" = vnni ]; then ARGS="$ARGS -DGGML_AVX_VNNI=ON"; else OFF="$OFF AVX_VNNI"; fi
for f in $OFF; do ARGS="$ARGS -DGGML_$f=OFF"; done
CMAKE_ARGS="$ARGS" "$PY" -m pip install --no-cache-dir --no-binary llama-cpp-python --no-deps \
    --target "$DIR" "llama-cpp-python==$VERSION"
PYTHONPATH="$DIR" "$PY" -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
