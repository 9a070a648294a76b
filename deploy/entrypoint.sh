#!/bin/sh
# The container's start: `tieredkv serve` on every interface, never without an API key.
# With no $TIEREDKV_API_KEY and no key file, a random key is generated into the key file (mode
# 600, on the data volume, so it survives restarts) and its path is printed. Extra arguments
# go to `tieredkv serve` (for example --api-keys-file, or a --disk-cache-size).
set -eu
DATA_DIR=${TIEREDKV_DATA_DIR:-/data}
KEY_FILE=${TIEREDKV_API_KEY_FILE:-$DATA_DIR/api-key}
PORT=${TIEREDKV_PORT:-8000}
# The remote tier's Redis password, from a file (a compose secret) into the environment,
# where the server reads it: never on a command line.
if [ -n "${TIEREDKV_REDIS_PASSWORD_FILE:-}" ] && [ -z "${TIEREDKV_REDIS_PASSWORD:-}" ]; then
  TIEREDKV_REDIS_PASSWORD=$(head -n 1 "$TIEREDKV_REDIS_PASSWORD_FILE")
  export TIEREDKV_REDIS_PASSWORD
fi
# The replicas' shared secret that names and seals remote pages, the same way.
if [ -n "${TIEREDKV_REMOTE_SECRET_FILE:-}" ] && [ -z "${TIEREDKV_REMOTE_SECRET:-}" ]; then
  TIEREDKV_REMOTE_SECRET=$(head -n 1 "$TIEREDKV_REMOTE_SECRET_FILE")
  export TIEREDKV_REMOTE_SECRET
fi
set -- --host 0.0.0.0 --port "$PORT" \
  --disk-cache-dir "$DATA_DIR/kv" --disk-cache-size "${TIEREDKV_DISK_CACHE_SIZE:-16GiB}" "$@"
if [ -z "${TIEREDKV_API_KEY:-}" ]; then
  if [ ! -e "$KEY_FILE" ]; then
    (umask 077 && python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > "$KEY_FILE")
    echo "tieredkv: no API key was given; generated one in $KEY_FILE" >&2
  fi
  set -- --api-key-file "$KEY_FILE" "$@"
fi
exec tieredkv serve "$@"
