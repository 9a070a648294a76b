"""The model fingerprint: what a cached page's KV depends on besides its tokens.

It covers the weights (an xxh3_128 digest of the weight files' bytes), the tokenizer files, the
architecture config, the weight dtype and the page layout (which includes the page size and the
KV dtype). Disk records carry it, so a page computed by another model, or by the same model
with different settings, is never served.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from tieredkv.cache.page_layout import PageLayout
from tieredkv.model.default_model import cache_root

if TYPE_CHECKING:
    from tieredkv.model.loader import LoadedModel

log = logging.getLogger(__name__)

FINGERPRINT_BYTES = 16
_CHUNK_BYTES = 16 << 20


def model_fingerprint(model: LoadedModel, layout: PageLayout) -> bytes:
    """A 16-byte BLAKE2b digest of everything a page's KV depends on besides its tokens."""
    h = hashlib.blake2b(digest_size=FINGERPRINT_BYTES, person=b"tieredkv-model")
    weight_dtype = next(iter(model.weights.values())).dtype
    for part in (
        b"v1",
        model.weights_digest,
        model.tokenizer.files_digest,
        repr(dataclasses.astuple(model.config)).encode(),
        str(weight_dtype).encode(),
        layout.describe().encode(),
    ):
        h.update(len(part).to_bytes(4, "little"))
        h.update(part)
    return h.digest()


def weights_digest(files: list[Path]) -> bytes:
    """xxh3_128 over the files' names, sizes and per-file content digests, in the given order.

    Each file's content digest is cached under `cache_root()/digests`, keyed by absolute path,
    size, mtime and inode, so an unchanged 540 MB model is not re-read on every start.
    """
    digest = xxhash.xxh3_128()
    for path in files:
        content = _file_digest(path)
        digest.update(f"{path.name}:{path.stat().st_size}:".encode())
        digest.update(content)
    return digest.digest()


def file_digest_uncached(path: Path) -> bytes:
    """xxh3_128 of a file's bytes, streamed in 16 MiB chunks."""
    digest = xxhash.xxh3_128()
    buffer = bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            digest.update(view[:n])
    return digest.digest()


def _file_digest(path: Path) -> bytes:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
    entry = cache_root() / "digests" / hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
    try:
        cached = entry.read_bytes()
        if len(cached) == 16:
            return cached
    except OSError:
        pass
    digest = file_digest_uncached(path)
    _write_entry(entry, digest)
    return digest


def _write_entry(entry: Path, digest: bytes) -> None:
    """Best effort: an unwritable cache only costs a re-hash next start."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(digest)
        os.replace(tmp, entry)
    except OSError as exc:
        log.debug("cannot cache weight digest at %s: %s", entry, exc)
