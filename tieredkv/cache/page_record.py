"""A page as both stores record it: its identity, its payload's codec, the record checksum and
the model fingerprint's digest. Pure.

The disk store (`disk.format`: a header in a slot of the store file) stores the page's
identity (`PageRecord`), its payload raw or lz4 (`CODECS`; lz4 only where it shrinks the page,
so a payload is never longer than the page), an xxh3_64 over the record's fields and its stored
payload (`record_checksum`), and a 32-byte digest of the model fingerprint
(`fingerprint_digest`). The remote store (`remote.record`: one self-describing value in Redis)
shares the codecs, and seals its values with a keyed MAC instead of the checksum (it is shared
with other machines; the disk is the server's own). A change here changes both stores' bytes:
each carries its own format version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from types import ModuleType

import xxhash

from tieredkv.errors import ConfigError

CODECS = {"raw": 0, "lz4": 1}  # the codec byte each stored record carries
CODEC_NAMES = {value: name for name, value in CODECS.items()}
RAW = CODECS["raw"]
LZ4 = CODECS["lz4"]


@dataclass(frozen=True)
class PageRecord:
    """A page's identity, stored beside its bytes: a store serves the bytes only to a reader
    that asks for this key, and only when the key chains from the parent key and the tokens."""

    key: bytes  # 16 bytes: page_key(parent_key, tokens)
    parent_key: bytes  # 16 bytes: the parent page's key, or the namespace root key
    tokens: tuple[int, ...]  # page_size tokens
    # whether the copy written or read keeps the page's sliding-window layers (a store that
    # keeps parts apart: the remote tier's `part_values`); every layer of a whole page does
    sliding_held: bool = field(default=True, kw_only=True, compare=False)
    # a disk layer record (`disk.split_store`): the one layer of the page it holds; None: all
    layer: int | None = field(default=None, kw_only=True, compare=False)


def fingerprint_digest(fingerprint: bytes) -> bytes:
    """A fixed-size stand-in for a model fingerprint of any length (32 bytes)."""
    return hashlib.blake2b(fingerprint, digest_size=32, person=b"tieredkv-disk").digest()


def record_checksum(fields: bytes | memoryview, payload: memoryview) -> int:
    """xxh3_64 over a record's fields and its stored payload (the streaming update releases the
    GIL on the payload, so checksums in worker threads do not stall the engine thread)."""
    digest = xxhash.xxh3_64(fields)
    digest.update(payload)
    return digest.intdigest()


def lz4_block() -> ModuleType:
    """The lz4 block codec, imported on first use (only the "lz4" codec needs it)."""
    try:
        import lz4.block
    except ImportError as error:
        raise ConfigError('the "lz4" codec needs the lz4 package: pip install lz4') from error
    return lz4.block


def encode_payload(page: memoryview, codec: int) -> tuple[int, memoryview]:
    """The stored form of a page's bytes: (the codec it is stored with, the payload). lz4 falls
    back to raw when it does not shrink the page."""
    if codec == LZ4:
        packed = lz4_block().compress(page, store_size=False)
        if len(packed) < page.nbytes:
            return LZ4, memoryview(packed)
    return RAW, page


def decode_payload(codec: int, payload: memoryview, page_bytes: int) -> memoryview | None:
    """The page's `page_bytes` bytes from a verified payload (raw: a view of it, no copy), or
    None when the payload does not decode to exactly one page."""
    if codec == RAW:
        return payload if payload.nbytes == page_bytes else None
    if codec != LZ4:
        return None
    block = lz4_block()
    try:
        page = block.decompress(payload, uncompressed_size=page_bytes)
    except block.LZ4BlockError:
        return None
    return memoryview(page) if len(page) == page_bytes else None
