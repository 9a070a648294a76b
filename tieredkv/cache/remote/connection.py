"""Opening the Redis client, single server or cluster, and the timeouts every call runs under.

Single or cluster is asked of the server: the store connects to the URL's node, reads
`INFO cluster`, and opens a cluster client (`redis.cluster.RedisCluster`, which discovers the
other nodes from that one) when `cluster_enabled:1`, a plain client otherwise. The same URL
works for both. A cluster counts as reachable only while that node reports `cluster_state:ok`:
with a master down, its nodes still answer PING but refuse every key (CLUSTERDOWN); a cluster
client warms one connection to every master before it is used. redis-py's own retries are off:
the store's caller gives up within its budget and the store reconnects in the background
instead. Slots that move between masters are followed by redis-py (ASK, MOVED).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from tieredkv.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteTimeouts:
    """How long the store may take. A lookup or a fetch waits at most its budget, then returns
    "nothing found" and the store turns degraded; writes and reconnects run in the background."""

    lookup_s: float = 0.020  # one pipelined EXISTS of a prompt's next pages
    fetch_s: float = 0.050  # one pipelined GET, plus fetch_per_mib_s per MiB of pages asked for
    fetch_per_mib_s: float = 0.005  # 200 MB/s: a slower link counts as degraded
    io_s: float = 1.0  # socket timeout: a stuck read frees its thread; one write batch's limit
    connect_s: float = 0.200  # one connection attempt (background)
    backoff_min_s: float = 0.100  # first wait between reconnection attempts, doubled each time
    backoff_max_s: float = 5.0

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not value > 0:
                raise ConfigError(f"remote timeout {field.name} must be > 0, got {value!r}")
        if self.backoff_max_s < self.backoff_min_s:
            raise ConfigError(
                f"remote timeout backoff_max_s={self.backoff_max_s} < "
                f"backoff_min_s={self.backoff_min_s}"
            )

    def scaled(self, factor: float) -> RemoteTimeouts:
        """The lookup and fetch budgets times `factor` (a slow link, or a loaded host)."""
        return replace(
            self,
            lookup_s=self.lookup_s * factor,
            fetch_s=self.fetch_s * factor,
            fetch_per_mib_s=self.fetch_per_mib_s * factor,
        )

    def fetch_budget_s(self, num_bytes: int) -> float:
        return self.fetch_s + self.fetch_per_mib_s * num_bytes / (1 << 20)


# The parser reads the socket this much at a time (redis-py's default is 64 KiB). A page is
# ~368 KB in bf16, so 64 KiB reads take several system calls per page; 1 MiB reads a few pages
# a call, and larger reads only grow the buffer without reading pipelined GETs any faster.
SOCKET_READ_BYTES = 1 << 20


# A query parameter whose name holds one of these carries a credential (redis-py passes every
# query parameter to the connection: `?password=`, `?ssl_password=`, ...)
SECRET_QUERY_WORDS = ("pass", "secret", "token", "auth", "cred")
CREDENTIALS_FIX = (
    "put the password in $TIEREDKV_REDIS_PASSWORD or a file named by --remote-password-file "
    "(mode 600): a URL shows in `ps` and in logs"
)


def check_url(url: str) -> None:
    """Refuse a URL that is not redis:// or rediss://, or that carries a credential (a password
    in its user info, or a password-like query parameter). The error never repeats the URL's
    secret."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ConfigError(
            f"--remote-cache-url must be redis://HOST:PORT/DB, got {redacted_url(url)!r}"
        )
    if parts.password is not None:
        raise ConfigError(f"--remote-cache-url must not carry a password; {CREDENTIALS_FIX}")
    secret = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True) if _secret(name)]
    if secret:
        raise ConfigError(
            f"--remote-cache-url must not carry credentials (query parameter {secret[0]!r}); "
            f"{CREDENTIALS_FIX}"
        )


def redacted_url(url: str) -> str:
    """`url` fit for a log line: no user info, and every query parameter's value hidden."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    query = "&".join(f"{name}=***" for name, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _secret(name: str) -> bool:
    return any(word in name.lower() for word in SECRET_QUERY_WORDS)


def redis_module() -> Any:
    """redis-py, imported on first use."""
    try:
        import redis
        import redis.cluster
    except ImportError as error:
        raise ConfigError(
            "the remote tier needs the redis package: pip install 'redis>=5' 'hiredis>=2'"
        ) from error
    return redis


def open_client(url: str, password: str | None, timeouts: RemoteTimeouts) -> Any:
    """A connected client (redis.Redis or redis.cluster.RedisCluster) that has answered PING.
    Raises redis.RedisError or OSError when the server cannot be reached or refuses us."""
    redis = redis_module()
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options = {
        "password": password,
        "socket_timeout": timeouts.io_s,
        "socket_connect_timeout": timeouts.connect_s,
        "retry": Retry(NoBackoff(), 0),
        "socket_read_size": SOCKET_READ_BYTES,
    }
    probe = redis.Redis.from_url(url, **options)
    try:
        cluster = probe.info("cluster").get("cluster_enabled") == 1
        if cluster:  # a node answers PING while its cluster is down: ask the cluster itself
            state = probe.cluster("info").get("cluster_state")
            if state != "ok":
                raise redis.exceptions.ClusterDownError(f"cluster_state is {state}")
    finally:
        probe.close()
    if cluster:
        client = redis.cluster.RedisCluster.from_url(url, **options)
        # one connection to every master now, not inside the first lookup's budget
        client.ping(target_nodes=redis.cluster.RedisCluster.ALL_NODES)
    else:
        client = redis.Redis.from_url(url, **options)
        client.ping()
    kind = "cluster" if cluster else "single"
    log.info("remote store: connected to %s (%s)", redacted_url(url), kind)
    return client


def connection_errors() -> tuple[type[BaseException], ...]:
    """What a call treats as the store being unreachable, slow or refusing us."""
    redis = redis_module()
    return (redis.RedisError, OSError)
