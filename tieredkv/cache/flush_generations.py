"""Flush generations: after a flush, no copy of a flushed namespace's pages is matched again,
in any tier, on any replica that shares the generations, after a restart too.

A flush advances a generation: an admin's flush (every namespace) the global one, a tenant's
flush its tenant's (all its namespaces, salts included). A namespace's root key mixes in the
pair (global, its tenant's) (`index.page_key.namespace_root_key`), so when either advances,
every page key below it changes: device, host and disk copies of an older generation are
matched no more (the flush drops those the tree names; the others, such as disk records a
restart indexed under roots no namespace names yet, leave by LRU), and remote values of an
older generation are never named again (Redis's own eviction drops them).

The generations persist in `generations.json` (mode 0600) in the disk tier's directory, keyed
by a digest of the scope (no tenant name is written), so a restart keeps them. Replicas sharing
a remote tier share them through the store (`remote.shared_generations`): a flush advances the
shared generation past every replica's, and each replica adopts the shared ones it reads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from tieredkv.cache.disk.directory import GENERATIONS_FILE
from tieredkv.errors import DiskStoreError
from tieredkv.tenants import split_namespace

log = logging.getLogger(__name__)

# Advances a scope's shared generation to at least the given one, past the shared one; returns
# the shared generation now, or None when the shared store could not be reached.
ShareGeneration = Callable[[str, int], "int | None"]


@lru_cache(maxsize=4096)
def scope_digest(tenant: str | None) -> str:
    """The key of a flush scope: every namespace (None) or one tenant's."""
    scope = "*" if tenant is None else "tenant:" + tenant
    return hashlib.blake2b(scope.encode(), digest_size=16, person=b"tieredkv-flush").hexdigest()


_EVERY_NAMESPACE = scope_digest(None)


class FlushGenerations:
    """Each flush scope's generation (0 until its first flush). `of` runs on the engine thread
    at every match; `advance` on the engine thread at a flush; `adopt` on the thread that reads
    the shared generations."""

    def __init__(self, directory: Path | None = None) -> None:
        self._path = directory / GENERATIONS_FILE if directory is not None else None
        self._lock = threading.Lock()
        self._generations: dict[str, int] = self._load()
        self.share: ShareGeneration | None = None  # set when a remote tier shares them
        self.on_close: Callable[[], None] | None = None

    def of(self, namespace: str) -> tuple[int, int]:
        """The (global, tenant's) generation a namespace's root key mixes in."""
        tenant, _ = split_namespace(namespace)
        generations = self._generations  # replaced whole, never changed in place
        everyone = generations.get(_EVERY_NAMESPACE, 0)
        return everyone, 0 if tenant is None else generations.get(scope_digest(tenant), 0)

    def advance(self, tenant: str | None) -> int:
        """A flush of every namespace (None) or of a tenant's: its scope's next generation,
        past the shared one when a remote tier shares them (one call within its budget)."""
        digest = scope_digest(tenant)
        wanted = self._generations.get(digest, 0) + 1
        shared = self.share(digest, wanted) if self.share is not None else None
        with self._lock:
            generation = max(wanted, shared or 0, self._generations.get(digest, 0))
            self._generations = {**self._generations, digest: generation}
            self._save()
        return generation

    def adopt(self, shared: dict[str, int]) -> dict[str, int]:
        """Take on the shared generations ahead of ours (another replica's flushes); returns
        ours that are ahead of the shared ones (flushes the store missed), to share."""
        with self._lock:
            ahead = {d: g for d, g in shared.items() if g > self._generations.get(d, 0)}
            if ahead:
                self._generations = {**self._generations, **ahead}
                self._save()
            mine = self._generations
        return {d: g for d, g in mine.items() if g > shared.get(d, 0)}

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()

    def _load(self) -> dict[str, int]:
        if self._path is None or not self._path.exists():
            return {}
        try:
            data = json.loads(self._path.read_text())
            return {str(d): int(g) for d, g in data.items() if int(g) > 0}
        except (OSError, ValueError, AttributeError) as error:
            # a lost generation could serve flushed pages again: refuse to start without it
            message = f"{self._path}: unreadable flush generations ({error})"
            raise DiskStoreError(message) from error

    def _save(self) -> None:
        if self._path is None:
            return
        try:
            self._write(self._path)
        except OSError as error:  # kept in memory: this process still forgets
            log.error("could not save the flush generations to %s: %s", self._path, error)

    def _write(self, path: Path) -> None:
        temporary = path.with_name(GENERATIONS_FILE + ".tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        with os.fdopen(os.open(temporary, flags, 0o600), "w") as file:
            os.fchmod(file.fileno(), 0o600)
            json.dump(self._generations, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
