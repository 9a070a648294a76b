#!/usr/bin/env bash
# NVIDIA Dynamo's KV-aware router for benchmarks/router_compare.py, in a venv of its own.
#
#   benchmarks/dynamo_router.sh install     # the venv (default .venv-router in the repository)
#   benchmarks/dynamo_router.sh check       # prints the runtime's version, or fails
#
# Only `ai-dynamo-runtime` (the Rust runtime, router and indexer with their Python bindings) is
# installed. The `ai-dynamo` package on top of it pulls `aisimulate`, a placeholder whose build
# downloads the real wheel from NVIDIA's own index, which a machine that reaches PyPI alone
# cannot; benchmarks/dynamo_router.py needs nothing from it. No etcd and no NATS: the router and
# its workers find each other through files (discovery backend `file`), requests go over TCP and
# events over ZMQ.
#
# Environment: DYNAMO_VERSION (pinned: the release the committed results ran), ROUTER_VENV
# (venv path), ROUTER_PYTHON (an interpreter for the venv, Python 3.10 or newer; default
# python3.11 when present, else python3).
set -euo pipefail

DYNAMO_VERSION=${DYNAMO_VERSION:-1.6.1}
ROUTER_VENV=${ROUTER_VENV:-"$(cd "$(dirname "$0")/.." && pwd)/.venv-router"}
if [[ -z "${ROUTER_PYTHON:-}" ]]; then
    ROUTER_PYTHON=$(command -v python3.11 || command -v python3)
fi

case "${1:-}" in
    install)
        "$ROUTER_PYTHON" -m venv "$ROUTER_VENV"
        "$ROUTER_VENV/bin/pip" install --upgrade pip
        "$ROUTER_VENV/bin/pip" install "ai-dynamo-runtime==$DYNAMO_VERSION"
        ;;
    check)
        "$ROUTER_VENV/bin/python" -c \
            "from importlib.metadata import version; print(version('ai-dynamo-runtime'))"
        ;;
    *)
        echo "usage: benchmarks/dynamo_router.sh install|check" >&2
        exit 2
        ;;
esac
