# Redis for the remote tier, from Debian's redis-server. The password comes from the secret
# file (never a command line); maxmemory with allkeys-lru bounds the store: tieredkv never
# deletes, Redis drops the least recently used pages when full.
ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/*
COPY redis-entrypoint.sh /usr/local/bin/redis-entrypoint
EXPOSE 6379
ENTRYPOINT ["sh", "/usr/local/bin/redis-entrypoint"]
