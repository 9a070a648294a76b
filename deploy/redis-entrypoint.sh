#!/bin/sh
# Redis for the remote tier: the password from the secret file into a private config file,
# maxmemory from $REDIS_MAXMEMORY with allkeys-lru, no persistence (the tier is a cache).
# Starts as root to read the secret (a private file of the host's), then runs as redis.
set -eu
CONF=$(mktemp)
chmod 600 "$CONF"
chown redis:redis "$CONF"
{
  printf 'requirepass %s\n' "$(head -n 1 "${REDIS_PASSWORD_FILE:-/run/secrets/redis_password}")"
  printf 'maxmemory %s\nmaxmemory-policy allkeys-lru\n' "${REDIS_MAXMEMORY:-4gb}"
  printf 'bind 0.0.0.0\nprotected-mode no\nsave ""\nappendonly no\ndir /tmp\n'
} > "$CONF"
exec setpriv --reuid=redis --regid=redis --init-groups redis-server "$CONF"
