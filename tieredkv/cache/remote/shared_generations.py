"""The flush generations replicas share through the remote store (`FlushGenerations`).

One Redis hash, `tieredkv:gen`, maps each flush scope's digest to its generation. A flush
advances it with one script (atomic on the server): past both the shared generation and the
flushing replica's, so two replicas flushing at once still end past each other's pages. Every
replica reads the hash every `POLL_S` (one HGETALL) and adopts what is ahead of its own, so a
flush on one replica stops the others matching the flushed pages within `POLL_S` plus one
lookup budget; a flush the store missed (it was unreachable) is shared at the next read that
reaches it.
"""

from __future__ import annotations

import logging
import threading

from tieredkv.cache.flush_generations import FlushGenerations
from tieredkv.cache.remote.store import RemoteStore

log = logging.getLogger(__name__)

HASH_KEY = "tieredkv:gen"
MAX_GENERATION = (1 << 63) - 1  # what a root key holds; a larger value is no replica's
POLL_S = 1.0  # how stale another replica's view of a flush can be (plus one lookup budget)
# KEYS[1] the hash, ARGV[1] the scope, ARGV[2] the generation wanted, ARGV[3] 1 to go past the
# shared one (a flush), 0 to reach it only (sharing one the store missed)
_ADVANCE = """
local shared = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local generation = math.max(shared + tonumber(ARGV[3]), tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], ARGV[1], generation)
return generation
"""


class SharedGenerations:
    """Shares `generations` through `store`: advances on flush, and a thread that reads the
    shared ones every `poll_s`."""

    def __init__(
        self, store: RemoteStore, generations: FlushGenerations, poll_s: float = POLL_S
    ) -> None:
        self._store = store
        self._generations = generations
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tieredkv-generations", daemon=True)
        generations.share = self.advance
        generations.on_close = self.close

    def start(self) -> None:
        self.read()  # at start, before the first request: a restart keeps up with the others
        self._thread.start()

    def advance(self, digest: str, generation: int, past_shared: bool = True) -> int | None:
        """Set the scope's shared generation to at least `generation` (and past the shared one
        when `past_shared`); the shared generation now, or None when the store did not answer."""
        step = 1 if past_shared else 0
        return self._store.call(
            lambda client: int(client.eval(_ADVANCE, 1, HASH_KEY, digest, generation, step)),
            None,
        )

    def read(self) -> None:
        """Adopt the shared generations; share ours that the store missed."""
        shared = self._store.call(lambda client: client.hgetall(HASH_KEY), None)
        if shared is None:
            return
        try:
            decoded = {_text(digest): int(value) for digest, value in shared.items()}
        except ValueError as error:  # a value no replica wrote
            log.warning("unreadable shared flush generations: %s", error)
            return
        decoded = {d: g for d, g in decoded.items() if 0 < g <= MAX_GENERATION}
        for digest, generation in self._generations.adopt(decoded).items():
            self.advance(digest, generation, past_shared=False)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._poll_s + 1.0)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):  # SYNC: the period between two reads
            self.read()


def _text(digest: bytes | str) -> str:
    return digest.decode() if isinstance(digest, bytes) else digest
