# A Python 3.11 image with torch's CPU build, made from a Debian image: it stands in for
# python:3.11-slim where no image registry is reachable (deploy/base/build.sh builds it).
ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
# pip trusts the system's certificates (with any local CA the Debian image holds), not its own.
ENV PATH=/opt/venv/bin:$PATH PIP_CERT=/etc/ssl/certs/ca-certificates.crt
# torch's CPU build: a wheel in the build context (the machine's own copy), else PyTorch's index.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY wheels/ /tmp/wheels/
RUN pip install --no-cache-dir --upgrade pip \
 && pip install --no-cache-dir --find-links /tmp/wheels \
      ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} "torch==2.13.0+cpu" \
 && rm -rf /tmp/wheels
