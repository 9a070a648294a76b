"""A remote page value: a self-describing header sealed with a keyed MAC, and the stored
payload. Pure.

A value (little-endian throughout):

| offset | size | field                                                               |
|--------|------|---------------------------------------------------------------------|
| 0      | 4    | magic b"TKVM"                                                       |
| 4      | 1    | format version                                                      |
| 5      | 1    | codec (`page_record.CODECS`: 0 raw, 1 lz4)                          |
| 6      | 2    | P = page_size, the number of tokens                                 |
| 8      | 4    | page_bytes, the page's size once decoded                            |
| 12     | 4    | payload_len, the stored payload's size                              |
| 16     | 16   | the name it was written under (`StoreKeys.name` of the page key)    |
| 32     | 32   | `StoreKeys.mac`(header[0:32], stored payload): HMAC-SHA256          |
| 64     | …    | the stored payload                                                  |

No token is stored: the name the reader asks for is derived from the page key, which chains
the namespace and the tokens, so a value that verifies under the name asked for holds that
page. The record key the MAC uses is derived from the deployment secret and the model
fingerprint: a value sealed by another model or another secret, or not sealed at all, fails
the MAC. A value is served only when every field agrees with what the reader asked for.
"""

from __future__ import annotations

import enum
import hmac
import struct
from dataclasses import dataclass

from tieredkv.cache.page_record import LZ4, RAW, PageRecord, decode_payload, encode_payload
from tieredkv.cache.remote.secret import MAC_BYTES, StoreKeys

MAGIC = b"TKVM"
FORMAT_VERSION = 2
COMPRESSIONS = {"none": RAW, "lz4": LZ4}  # --remote-compression
_FIELDS = struct.Struct("<4sBBHII16s")
HEADER_BYTES = _FIELDS.size + MAC_BYTES


class RefusalReason(enum.Enum):
    """Why a value found under a requested name was not served (counted, then a miss)."""

    CORRUPT = "corrupt"  # short, bad magic, bad lengths, undecodable payload
    FINGERPRINT = "fingerprint"  # another page size, page bytes or format version
    MAC = "mac"  # forged, altered, or sealed by another secret or model
    KEY = "key"  # replayed: a sealed value of another page, copied under this name


@dataclass(frozen=True)
class RemotePage(PageRecord):
    """One page to store: its identity (its key is the name it is stored under: `StoreKeys.name`
    of the page key) and its bytes. Only the name and the bytes are stored."""

    data: bytes | memoryview  # page_bytes raw KV bytes


def max_value_bytes(page_bytes: int) -> int:
    """The longest value a page of `page_bytes` can be stored as (lz4 only when shorter)."""
    return HEADER_BYTES + page_bytes


def encode_value(page: RemotePage, keys: StoreKeys, codec: int) -> bytes:
    """The stored form of `page`; lz4 falls back to raw when it does not shrink the page."""
    raw = memoryview(page.data).cast("B")
    codec, payload = encode_payload(raw, codec)
    fields = _FIELDS.pack(
        MAGIC, FORMAT_VERSION, codec, len(page.tokens), len(raw), len(payload), page.key
    )
    return b"".join((fields, keys.mac(fields, payload), payload))


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
    name: bytes,
    keys: StoreKeys,
    page_size: int,
    page_bytes: int,
) -> DecodeResult:
    """Verify `value`, found under `name`, and return the page it holds (page_bytes bytes)."""
    if len(value) < HEADER_BYTES or value[:4] != MAGIC:
        return _refuse(RefusalReason.CORRUPT)
    _, version, codec, size, raw_len, payload_len, stored_name = _FIELDS.unpack_from(value)
    if (version, size, raw_len) != (FORMAT_VERSION, page_size, page_bytes):
        return _refuse(RefusalReason.FINGERPRINT)
    payload = memoryview(value)[HEADER_BYTES:]
    if len(payload) != payload_len or codec not in (RAW, LZ4):
        return _refuse(RefusalReason.CORRUPT)
    mac = keys.mac(value[: _FIELDS.size], payload)
    if not hmac.compare_digest(mac, value[_FIELDS.size : HEADER_BYTES]):
        return _refuse(RefusalReason.MAC)
    if stored_name != name:
        return _refuse(RefusalReason.KEY)
    data = decode_payload(codec, payload, page_bytes)
    return DecodeResult(data) if data is not None else _refuse(RefusalReason.CORRUPT)
