#!/usr/bin/env bash
# The cuda backend's GPU checks in one command, for a machine with an NVIDIA GPU and CuPy
# (e.g. `pip install -e '.[cuda13]'`, or the GPU machine's preinstalled cupy-cuda13x).
# Installs and downloads nothing. Runs, in order (at most about 7 minutes):
#   1. a preflight: CuPy imports, sees a GPU, and compiles kernels/*.cu with NVRTC;
#   2. the gpu-marked tests: every kernel against its NumPy reference, and the whole
#      dense stack against the host body (a prefill, a prefill over the cached prefix and
#      decode tokens with the lm head on the device: logits within 1e-2 of their scale,
#      identical argmax) on llama / qwen2 / qwen3 / gemma3 / starcoder2 / ALiBi (bloom,
#      mpt)-shaped random models;
#      the quantized kernels (kernels/quant.cu) for every type the host keeps in blocks:
#      dequantize bit for bit with gguf-py, gemv to 1e-5 of dequantize-then-matmul, and the
#      stack on weights resident in Q4_0 / Q8_0 / Q5_1 / BF16 blocks against the host body;
#   3. pp512 and tg16 of the stack against the host body on random weights of real shapes
#      (scripts/cuda_pp512.py; extra arguments go to it, e.g. --shapes smollm2-135m);
#   4. the same with every matrix resident in Q4_0 blocks (decode reads the blocks, a prompt
#      dequantizes tiles for cuBLAS), with the resident weight bytes.
# Results: stdout, plus $OUT/gpu_check.json when OUT is set (where the device tool
# collects files). Every step runs even when an earlier one fails (a lease is short, so one
# call must say everything); the exit status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

failed=()
step() {  # step NAME COMMAND...: run it, remember a failure, go on
    local name="$1"; shift
    echo "== $name"
    "$@" || { echo "!! $name failed (exit $?)"; failed+=("$name"); }
}

preflight() {
timeout 60 "$PY" - <<'PYEOF'
import cupy, numpy as np
from frink_cli.backends.cupy import cupy_kernel_ops
n = cupy.cuda.runtime.getDeviceCount()
props = cupy.cuda.runtime.getDeviceProperties(0)
print(f"cupy {cupy.__version__}, numpy {np.__version__}, {n} GPU(s): {props['name'].decode()}, "
      f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
ops = cupy_kernel_ops()
x = cupy.ones((4, 64), cupy.float32)
y = ops.rms_norm(x, cupy.ones(64, cupy.float32), 1e-5)
assert float(abs(y - 1).max()) < 1e-5, "rms_norm kernel gave a wrong answer"
x = cupy.arange(4 * 64, dtype=cupy.float32).reshape(4, 64)
y = ops.layer_norm(x, cupy.ones(64, cupy.float32), cupy.full(64, 2.0, cupy.float32), 1e-5)
assert float(abs(y.mean(axis=1) - 2).max()) < 1e-4, "layer_norm kernel gave a wrong answer"
print("kernels compile and run")
PYEOF
}
step preflight preflight

step "gpu tests" timeout 200 "$PY" -m pytest -q -m gpu tests/test_cuda_gpu.py -p no:cacheprovider -rs -s

json_out=()
if [ -n "${OUT:-}" ]; then json_out=(--json "$OUT/gpu_check.json"); fi
step "pp512 + tg16: dense stack vs host body" \
    timeout 90 "$PY" scripts/cuda_pp512.py "${json_out[@]}" "$@"

json_out=()
if [ -n "${OUT:-}" ]; then json_out=(--json "$OUT/gpu_check_q4_0.json"); fi
step "pp512 + tg16: weights resident in Q4_0 blocks" \
    timeout 90 "$PY" scripts/cuda_pp512.py --qtype Q4_0 --shapes smollm2-135m,llama-3.2-1b \
    "${json_out[@]}"

if [ ${#failed[@]} -gt 0 ]; then
    echo "== FAILED: ${failed[*]}"
    exit 1
fi
echo "== all steps passed"
