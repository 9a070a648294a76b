#!/bin/sh
# Base images made on this machine, for building the compose files' images where no image
# registry is reachable (only Debian's archive and PyPI): a Debian bookworm image from
# debootstrap, and a Python image with torch's CPU build on top of it. Run as root:
#   sh deploy/base/build.sh
# then build and start with those bases (the compose files read these two variables):
#   export TIEREDKV_DEBIAN_IMAGE=tieredkv/debian:bookworm TIEREDKV_PYTHON_IMAGE=tieredkv/python:3.11
#   docker compose -f deploy/compose.replicas.yml up --build
# $TORCH_WHEEL_DIR: a directory holding torch's CPU wheel (default /opt/wheels, if it holds one);
# without one, the wheel comes from PyTorch's CPU index. The machine's own extra CA certificates
# (/usr/local/share/ca-certificates, e.g. a TLS-inspecting proxy's) go into the Debian image, so
# apt and pip inside trust what the machine trusts.
set -eu
DEBIAN_TAG=${TIEREDKV_DEBIAN_IMAGE:-tieredkv/debian:bookworm}
PYTHON_TAG=${TIEREDKV_PYTHON_IMAGE:-tieredkv/python:3.11}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WHEEL_DIR=${TORCH_WHEEL_DIR:-/opt/wheels}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if ! docker image inspect "$DEBIAN_TAG" >/dev/null 2>&1; then
  debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR"
  mkdir -p "$WORK/rootfs/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$WORK/rootfs/usr/local/share/ca-certificates/" \
    2>/dev/null || true
  tar -C "$WORK/rootfs" -c . | docker import - "$DEBIAN_TAG"
  rm -rf "$WORK/rootfs"
fi

mkdir -p "$WORK/context/wheels"
cp "$HERE/python.Dockerfile" "$WORK/context/Dockerfile"
TORCH_INDEX=https://download.pytorch.org/whl/cpu
for wheel in "$WHEEL_DIR"/torch-2.13.0+cpu-*.whl; do
  [ -e "$wheel" ] || continue
  cp "$wheel" "$WORK/context/wheels/"
  TORCH_INDEX=
done
docker build -t "$PYTHON_TAG" --build-arg DEBIAN_IMAGE="$DEBIAN_TAG" \
  --build-arg TORCH_INDEX="$TORCH_INDEX" "$WORK/context"
echo "built $DEBIAN_TAG and $PYTHON_TAG"
