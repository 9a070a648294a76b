#!/usr/bin/env bash
# SGLang's RadixCache beside tieredkv's tree, for benchmarks/radix_vs_sglang.py (run from the
# repository root). SGLang is pinned (SGLANG_SPEC): its radix cache's API and costs change
# between releases, and the result names the version it measured.
#
#   benchmarks/sglang_radix.sh install        # .venv-sglang: SGLang and what its import needs
#   benchmarks/sglang_radix.sh run [ARGS...]  # python -m benchmarks.radix_vs_sglang ARGS
#
# .venv-sglang is a venv of its own layered on the project's .venv (`make install` first): a
# .pth adds .venv's site-packages after its own, so tieredkv and torch==2.13.0 (the CPU build
# the Makefile pins) come from there and nothing is installed into .venv. SGLang is installed
# with --no-deps: its metadata asks for CUDA kernels, flashinfer and torch 2.14.1, none of
# which the radix cache uses; the packages below are exactly what importing
# sglang.srt.mem_cache.radix_cache needs (found by importing it until nothing was missing).
# torchvision is not among them: PyPI's is a CUDA build whose ops fail to register on CPU torch,
# and sglang's model configs import it at module level, so benchmarks/radix/sglang_replay.py
# puts a stand-in module in its place (the radix cache never calls it).
#
# Environment: SGLANG_VENV (default .venv-sglang), TIEREDKV_VENV (default .venv).
set -euo pipefail

SGLANG_VENV=${SGLANG_VENV:-.venv-sglang}
TIEREDKV_VENV=${TIEREDKV_VENV:-.venv}
SGLANG_SPEC=sglang==0.5.23
TORCH_SPEC=torch==2.13.0
IMPORT_DEPS=(
    orjson==3.13.0 pybase64==1.5.1 msgspec==0.23.0 pyzmq==27.3.0 ipython==9.18.1
    traitlets==5.16.1 aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1
    propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 dill==0.4.1
    apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 compressed-tensors==0.18.0 loguru==0.7.3
)

die() { echo "sglang_radix.sh: $*" >&2; exit 2; }

install() {
    [[ -x "$TIEREDKV_VENV/bin/python" ]] || die "no $TIEREDKV_VENV: run 'make install' first"
    local base site
    base=$("$TIEREDKV_VENV/bin/python" -c 'import sys; print(sys._base_executable)')
    "$base" -m venv "$SGLANG_VENV"
    site=$("$SGLANG_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    local layered
    layered=$("$TIEREDKV_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$layered')" > "$site/tieredkv_venv.pth"
    local pip=("$SGLANG_VENV/bin/python" -m pip install -q --no-deps)
    if ! "$SGLANG_VENV/bin/python" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")'; then
        "${pip[@]}" "$TORCH_SPEC"  # the layered venv has another torch: pin this one here
    fi
    "${pip[@]}" "$SGLANG_SPEC" "${IMPORT_DEPS[@]}"
    "$SGLANG_VENV/bin/python" -c 'import torch
from benchmarks.radix.sglang_replay import load_sglang
print("sglang", load_sglang().sglang.__version__, "torch", torch.__version__)' 2>&1 \
        | grep -v -i warn
}

run() {
    [[ -x "$SGLANG_VENV/bin/python" ]] || die "no $SGLANG_VENV: run '$0 install' first"
    OMP_NUM_THREADS=1 exec "$SGLANG_VENV/bin/python" -m benchmarks.radix_vs_sglang "$@"
}

case "${1:-}" in
    install) install ;;
    run) shift; run "$@" ;;
    *) die "usage: $0 install | run [benchmarks.radix_vs_sglang args]" ;;
esac
