"""`RemoteClient`: the store's Redis client and its health. Healthy while calls succeed,
degraded from the first failure until a reconnection answers PING. Only the writer thread
reconnects. The first failed connection of each cycle (start-up, or degraded until healthy
again) is logged, with the URL redacted: a wrong password shows once, not at every attempt."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from tieredkv.cache.remote.connection import (
    CREDENTIALS_FIX,
    RemoteTimeouts,
    connection_errors,
    open_client,
    redacted_url,
    redis_module,
)
from tieredkv.cache.remote.memory_policy import check_memory_policy

log = logging.getLogger(__name__)


class RemoteClient:
    """One redis-py client at a time; callers read `redis` and report failures with
    `mark_degraded`."""

    def __init__(self, url: str, password: str | None, timeouts: RemoteTimeouts) -> None:
        self._url = url
        self._password = password
        self._timeouts = timeouts
        self._lock = threading.Lock()
        self._redis: Any = None
        self._healthy = threading.Event()
        self.on_degraded: Callable[[], None] = lambda: None  # wakes the writer to reconnect
        self.last_error = "not connected yet"
        self._failure_logged = False  # in this reconnection cycle
        self.memory_policy: str | None = None  # Redis's maxmemory-policy, read at connection

    @property
    def healthy(self) -> bool:
        return self._healthy.is_set()

    @property
    def redis(self) -> Any:
        """The current redis-py client, single-server or cluster (None before the first
        connection)."""
        return self._redis

    def wait_healthy(self, timeout_s: float) -> bool:
        return self._healthy.wait(timeout_s)  # SYNC: a test or start-up waits for the store

    def try_connect(self) -> bool:
        """Open a fresh client; True (and healthy) when it answered PING."""
        try:
            client = open_client(self._url, self._password, self._timeouts)
        except connection_errors() as error:
            self.last_error = f"{type(error).__name__}: {error}"
            self._log_failure(error)
            return False
        self.memory_policy = check_memory_policy(client)
        with self._lock:
            old, self._redis = self._redis, client
            self._healthy.set()
            self._failure_logged = False
        if old is not None:
            _close_quietly(old)
        log.info("remote store: healthy")
        return True

    def _log_failure(self, error: BaseException) -> None:
        where = redacted_url(self._url)
        if self._failure_logged:
            log.debug("remote store: connecting to %s failed again: %s", where, self.last_error)
            return
        self._failure_logged = True
        if isinstance(error, redis_module().AuthenticationError):
            log.error(
                "remote store: %s refused the password (%s); %s. Retrying in the background",
                where,
                self.last_error,
                "check $TIEREDKV_REDIS_PASSWORD or --remote-password-file"
                if self._password is not None
                else f"it needs one: {CREDENTIALS_FIX}",
            )
        else:
            log.warning(
                "remote store: cannot connect to %s (%s); retrying in the background",
                where,
                self.last_error,
            )

    def mark_degraded(self, error: BaseException | str) -> None:
        """A call failed or ran out of time: callers find nothing until a reconnection works."""
        with self._lock:
            was_healthy = self._healthy.is_set()
            self._healthy.clear()
            self.last_error = (
                error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            )
        if was_healthy:
            log.warning(
                "remote store degraded (%s); reconnecting in the background", self.last_error
            )
        self.on_degraded()

    def close(self) -> None:
        with self._lock:
            client, self._redis = self._redis, None
            self._healthy.clear()
        if client is not None:
            _close_quietly(client)


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except connection_errors():
        pass
