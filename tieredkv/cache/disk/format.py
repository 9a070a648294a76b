"""The disk store's file layout: the superblock and the record headers. Pure: no I/O.

One store file (little-endian throughout):

| offset                        | size                     | content                        |
|-------------------------------|--------------------------|--------------------------------|
| 0                             | SUPERBLOCK_BYTES (4 KiB) | superblock, checksummed        |
| SUPERBLOCK_BYTES              | num_slots × header_bytes | record headers, slot order     |
| payload_offset (4 KiB aligned)| num_slots × record_bytes | payloads, slot order           |

Headers live together so the warm-restart scan is one sequential read. A header:

| offset   | size | field                                                          |
|----------|------|----------------------------------------------------------------|
| 0        | 4    | magic b"TKVR" (all-zero header: free slot)                     |
| 4        | 1    | codec (`page_record.CODECS`: 0 raw, 1 lz4)                     |
| 5        | 1    | flags: bit 0 set when the page's sliding-window layers are not |
|          |      | held (zeros, never read: `PageRecord.sliding_held`); bit 1 set |
|          |      | in a layer record (one layer of the page: `split_store`);      |
|          |      | others 0                                                       |
| 6        | 2    | the layer a layer record holds (`PageRecord.layer`), else zero |
| 8        | 4    | payload_len (bytes stored, ≤ record_bytes)                     |
| 12       | 4    | reserved, zero                                                 |
| 16       | 16   | page key = page_key(parent_key, tokens)                        |
| 32       | 16   | parent page's key (or the namespace root key)                  |
| 48       | 4·P  | the page's P = page_size tokens, int32                         |
| 48+4P    | 8    | record checksum: `page_record.record_checksum`, xxh3_64 over   |
|          |      | header[0:48+4P] ‖ stored payload                               |
| 56+4P    | 8    | header checksum: xxh3_64(header[0:56+4P]), lets the scan check |
|          |      | a header without reading its payload                           |

The header checksum sits last, so a torn header write (any strict prefix) never verifies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import xxhash

from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.index.page_key import page_key
from tieredkv.cache.page_record import CODEC_NAMES, record_checksum

FORMAT_VERSION = 1
ALIGN_BYTES = 4096  # O_DIRECT-safe alignment of offsets, lengths and buffers
SUPERBLOCK_BYTES = ALIGN_BYTES
SUPERBLOCK_MAGIC = b"TKVSTORE"
RECORD_MAGIC = b"TKVR"
# magic, codec, flags, layer, payload_len, key, parent
_HEADER_FIXED = struct.Struct("<4sBBHI4x16s16s")
SLIDING_ABSENT = 1  # flags bit: the record holds the page without its sliding-window layers
LAYER_RECORD = 2  # flags bit: the record holds one layer of the page, the one the header names
_KNOWN_FLAGS = SLIDING_ABSENT | LAYER_RECORD
# magic, version, header_bytes, record_bytes, num_slots, payload_offset, page_size, dtype,
# fingerprint digest, layout length, layout text
_SUPERBLOCK = struct.Struct("<8sIIQQQI16s32sH512s")
_MAX_LAYOUT_BYTES = 512


def align_up(value: int, alignment: int = ALIGN_BYTES) -> int:
    return (value + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class Superblock:
    """What a store file was written for; any difference makes the file unusable."""

    header_bytes: int
    record_bytes: int
    num_slots: int
    page_size: int
    dtype: str
    fingerprint_digest: bytes  # 32 bytes
    layout: str  # PageLayout.describe()
    version: int = FORMAT_VERSION

    @property
    def payload_offset(self) -> int:
        return align_up(SUPERBLOCK_BYTES + self.num_slots * self.header_bytes)

    @property
    def file_bytes(self) -> int:
        return self.payload_offset + self.num_slots * self.record_bytes

    def encode(self) -> bytes:
        layout = self.layout.encode()
        if len(layout) > _MAX_LAYOUT_BYTES:
            raise ValueError(f"layout text is {len(layout)} bytes, at most {_MAX_LAYOUT_BYTES}")
        body = _SUPERBLOCK.pack(
            SUPERBLOCK_MAGIC,
            self.version,
            self.header_bytes,
            self.record_bytes,
            self.num_slots,
            self.payload_offset,
            self.page_size,
            self.dtype.encode(),
            self.fingerprint_digest,
            len(layout),
            layout,
        )
        body += xxhash.xxh3_64_digest(body)
        return body.ljust(SUPERBLOCK_BYTES, b"\0")


class SuperblockError(Exception):
    """A superblock that cannot be used; `reason` is CHECKSUM (corrupt) or FINGERPRINT."""

    def __init__(self, reason: DiskErrorReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def decode_superblock(data: bytes) -> Superblock:
    """Parse and verify a superblock; raises SuperblockError on anything unusable."""
    size = _SUPERBLOCK.size
    if len(data) < size + 8 or data[:8] != SUPERBLOCK_MAGIC:
        raise SuperblockError(
            DiskErrorReason.CHECKSUM, "not a tieredkv store (bad magic or short file)"
        )
    version = struct.unpack_from("<I", data, 8)[0]
    if version != FORMAT_VERSION:
        raise SuperblockError(
            DiskErrorReason.FINGERPRINT, f"format version {version}, want {FORMAT_VERSION}"
        )
    if xxhash.xxh3_64_digest(data[:size]) != data[size : size + 8]:
        raise SuperblockError(DiskErrorReason.CHECKSUM, "superblock checksum mismatch")
    fields = _SUPERBLOCK.unpack_from(data)
    block = Superblock(
        header_bytes=fields[2],
        record_bytes=fields[3],
        num_slots=fields[4],
        page_size=fields[6],
        dtype=fields[7].rstrip(b"\0").decode("ascii", "replace"),
        fingerprint_digest=fields[8],
        layout=fields[10][: fields[9]].decode("utf-8", "replace"),
        version=version,
    )
    if fields[5] != block.payload_offset:
        raise SuperblockError(
            DiskErrorReason.CHECKSUM, f"payload offset {fields[5]} is inconsistent"
        )
    return block


def header_bytes_for(page_size: int) -> int:
    """Size of one record header: the fields, rounded up to 64 bytes."""
    return align_up(64 + 4 * page_size, 64)


@dataclass(frozen=True)
class RecordHeader:
    """A decoded record header (the checksums already checked against the header itself)."""

    codec: int
    payload_len: int
    key: bytes
    parent_key: bytes
    tokens: tuple[int, ...]
    record_checksum: int
    fields: bytes  # the stored header bytes the record checksum starts with
    sliding_held: bool = True  # False: the page's sliding-window layers are not in the record
    layer: int | None = None  # a layer record's layer; None: the record holds every layer


def _fields(
    codec: int,
    flags: int,
    layer: int,
    payload_len: int,
    key: bytes,
    parent: bytes,
    tokens: np.ndarray,
) -> bytes:
    fixed = _HEADER_FIXED.pack(RECORD_MAGIC, codec, flags, layer, payload_len, key, parent)
    return fixed + tokens.tobytes()


def encode_header(
    header_bytes: int,
    codec: int,
    key: bytes,
    parent_key: bytes,
    tokens: tuple[int, ...],
    payload: memoryview,
    sliding_held: bool = True,
    layer: int | None = None,
) -> bytes:
    """The full header for a record whose stored payload is `payload` (`sliding_held` False:
    the page's sliding-window layers are zeros no reader may use; `layer`: the record holds
    that layer of the page only)."""
    flags = (0 if sliding_held else SLIDING_ABSENT) | (0 if layer is None else LAYER_RECORD)
    tokens_array = np.asarray(tokens, dtype="<i4")
    fields = _fields(codec, flags, layer or 0, len(payload), key, parent_key, tokens_array)
    with_sum = fields + struct.pack("<Q", record_checksum(fields, payload))
    return (with_sum + xxhash.xxh3_64_digest(with_sum)).ljust(header_bytes, b"\0")


def decode_header(data: bytes | memoryview, page_size: int) -> RecordHeader | None:
    """Parse a header; None when it is free (zero magic), torn or corrupt. Does not check the
    key chain or the payload: see `chain_ok` and `payload_ok`."""
    end = 56 + 4 * page_size
    data = bytes(data[: end + 8])
    if len(data) < end + 8 or data[:4] != RECORD_MAGIC:
        return None
    if xxhash.xxh3_64_digest(data[:end]) != data[end:]:
        return None
    _, codec, flags, layer, payload_len, key, parent = _HEADER_FIXED.unpack_from(data)
    if codec not in CODEC_NAMES or flags & ~_KNOWN_FLAGS or (layer and not flags & LAYER_RECORD):
        return None
    tokens = tuple(np.frombuffer(data, dtype="<i4", count=page_size, offset=48).tolist())
    (checksum,) = struct.unpack_from("<Q", data, end - 8)
    held = not flags & SLIDING_ABSENT
    layer_of = layer if flags & LAYER_RECORD else None
    fields = data[: end - 8]
    return RecordHeader(codec, payload_len, key, parent, tokens, checksum, fields, held, layer_of)


def payload_ok(header: RecordHeader, payload: memoryview) -> bool:
    """True when `payload` (exactly payload_len stored bytes) matches the record checksum."""
    return record_checksum(header.fields, payload) == header.record_checksum


def chain_ok(header: RecordHeader) -> bool:
    """True when the record's key is H(parent_key, tokens): the page is what it claims to be."""
    return page_key(header.parent_key, header.tokens) == header.key
