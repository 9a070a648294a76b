"""A remote page value: a self-describing, checksummed header and the stored payload. Pure.

A value (little-endian throughout):

| offset | size | field                                                          |
|--------|------|----------------------------------------------------------------|
| 0      | 4    | magic b"TKVM"                                                  |
| 4      | 1    | format version                                                 |
| 5      | 1    | codec (`page_record.CODECS`: 0 raw, 1 lz4)                     |
| 6      | 2    | P = page_size, the number of tokens                            |
| 8      | 4    | page_bytes, the page's size once decoded                       |
| 12     | 4    | payload_len, the stored payload's size                         |
| 16     | 32   | the model fingerprint's digest (`page_record`)                 |
| 48     | 16   | page key = page_key(parent_key, tokens)                        |
| 64     | 16   | parent page's key (or the namespace root key)                  |
| 80     | 4·P  | the page's tokens, int32                                       |
| 80+4P  | 8    | `page_record.record_checksum`(header[0:80+4P], stored payload) |
| 88+4P  | …    | the stored payload                                             |

A value is served only when every field agrees with what the reader asked for and expects.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import numpy as np

from tieredkv.cache.index.page_key import page_key
from tieredkv.cache.page_record import (
    LZ4,
    RAW,
    PageRecord,
    decode_payload,
    encode_payload,
    record_checksum,
)

MAGIC = b"TKVM"
FORMAT_VERSION = 1
COMPRESSIONS = {"none": RAW, "lz4": LZ4}  # --remote-compression
_FIXED = struct.Struct("<4sBBHII32s16s16s")


class RefusalReason(enum.Enum):
    """Why a value found under a requested key was not served (counted, then a miss)."""

    CORRUPT = "corrupt"  # short, bad magic, bad checksum, undecodable payload
    FINGERPRINT = "fingerprint"  # another model, page size, page bytes or format version
    KEY = "key"  # stored under another key, or its key is not H(parent, tokens)


@dataclass(frozen=True)
class RemotePage(PageRecord):
    """One page to store: its identity (key, parent key, tokens) and its bytes."""

    data: bytes | memoryview  # page_bytes raw KV bytes


def max_value_bytes(page_size: int, page_bytes: int) -> int:
    """The longest value a page of `page_bytes` can be stored as (lz4 only when shorter)."""
    return _FIXED.size + 4 * page_size + 8 + page_bytes


def encode_value(page: RemotePage, fingerprint_digest: bytes, codec: int) -> bytes:
    """The stored form of `page`; lz4 falls back to raw when it does not shrink the page."""
    raw = memoryview(page.data).cast("B")
    codec, payload = encode_payload(raw, codec)
    tokens = np.asarray(page.tokens, dtype="<i4").tobytes()
    fields = _FIXED.pack(
        MAGIC,
        FORMAT_VERSION,
        codec,
        len(page.tokens),
        len(raw),
        len(payload),
        fingerprint_digest,
        page.key,
        page.parent_key,
    )
    fields += tokens
    checksum = struct.pack("<Q", record_checksum(fields, payload))
    return b"".join((fields, checksum, payload))


@dataclass(frozen=True)
class DecodeResult:
    """A decoded value: the page's raw bytes (a view into the value when it was stored raw:
    no copy), or why it was refused."""

    data: memoryview | None
    refused: RefusalReason | None = None


def _refuse(reason: RefusalReason) -> DecodeResult:
    return DecodeResult(None, reason)


def decode_value(
    value: bytes | memoryview,
    key: bytes,
    fingerprint_digest: bytes,
    page_size: int,
    page_bytes: int,
) -> DecodeResult:
    """Verify `value`, found under `key`, and return the page it holds (page_bytes bytes)."""
    header_len = _FIXED.size + 4 * page_size
    if len(value) < header_len + 8 or value[:4] != MAGIC:
        return _refuse(RefusalReason.CORRUPT)
    _, version, codec, size, raw_len, payload_len, digest, stored_key, parent = _FIXED.unpack_from(
        value
    )
    if (version, size, raw_len, digest) != (
        FORMAT_VERSION,
        page_size,
        page_bytes,
        fingerprint_digest,
    ):
        return _refuse(RefusalReason.FINGERPRINT)
    payload = memoryview(value)[header_len + 8 :]
    (checksum,) = struct.unpack_from("<Q", value, header_len)
    if len(payload) != payload_len or codec not in (RAW, LZ4):
        return _refuse(RefusalReason.CORRUPT)
    if record_checksum(value[:header_len], payload) != checksum:
        return _refuse(RefusalReason.CORRUPT)
    tokens = np.frombuffer(value, dtype="<i4", count=page_size, offset=_FIXED.size)
    if stored_key != key or page_key(parent, tokens) != key:
        return _refuse(RefusalReason.KEY)
    data = decode_payload(codec, payload, page_bytes)
    return DecodeResult(data) if data is not None else _refuse(RefusalReason.CORRUPT)
