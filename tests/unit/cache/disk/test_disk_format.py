"""The on-disk format alone: superblock and record header encode/decode and checksums."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
import xxhash

from tieredkv.cache.disk import format as disk_format
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.format import (
    FORMAT_VERSION,
    SUPERBLOCK_BYTES,
    Superblock,
    SuperblockError,
    chain_ok,
    decode_header,
    decode_superblock,
    encode_header,
    header_bytes_for,
    payload_ok,
)
from tieredkv.cache.index.page_key import page_key
from tieredkv.cache.page_record import fingerprint_digest, record_checksum

PAGE_SIZE = 4
BLOCK = Superblock(
    header_bytes=header_bytes_for(PAGE_SIZE),
    record_bytes=4096,
    num_slots=10,
    page_size=PAGE_SIZE,
    dtype="bfloat16",
    fingerprint_digest=fingerprint_digest(b"model"),
    layout="layers=2,kv_heads=1,head_dim=8,page_size=4,dtype=bfloat16",
)


def test_superblock_round_trip() -> None:
    data = BLOCK.encode()
    assert len(data) == SUPERBLOCK_BYTES
    assert decode_superblock(data) == BLOCK
    assert BLOCK.payload_offset % 4096 == 0
    assert BLOCK.file_bytes == BLOCK.payload_offset + 10 * 4096


@pytest.mark.parametrize("offset", [0, 9, 20, 40, 100, 150])
def test_any_flipped_superblock_byte_is_refused_as_corrupt(offset: int) -> None:
    data = bytearray(BLOCK.encode())
    data[offset] ^= 0x01
    with pytest.raises(SuperblockError) as caught:
        decode_superblock(bytes(data))
    # byte 8..11 is the format version: a different version is a foreign format, not corruption
    assert caught.value.reason is (
        DiskErrorReason.FINGERPRINT if 8 <= offset < 12 else DiskErrorReason.CHECKSUM
    )


def test_other_format_version_is_a_fingerprint_mismatch() -> None:
    other = dataclasses.replace(BLOCK, version=FORMAT_VERSION + 1)
    with pytest.raises(SuperblockError) as caught:
        decode_superblock(other.encode())
    assert caught.value.reason is DiskErrorReason.FINGERPRINT


def test_short_superblock_is_refused() -> None:
    with pytest.raises(SuperblockError) as caught:
        decode_superblock(BLOCK.encode()[:100])
    assert caught.value.reason is DiskErrorReason.CHECKSUM


def _header(payload: bytes, tokens: tuple[int, ...] = (1, 2, 3, 4)) -> tuple[bytes, bytes]:
    parent = bytes(range(16))
    key = page_key(parent, tokens)
    return key, encode_header(BLOCK.header_bytes, 0, key, parent, tokens, memoryview(payload))


def test_header_round_trip_and_checks() -> None:
    payload = bytes(range(256))
    key, data = _header(payload)
    assert len(data) == BLOCK.header_bytes == 128
    header = decode_header(data, PAGE_SIZE)
    assert header is not None
    assert (header.key, header.tokens, header.payload_len) == (key, (1, 2, 3, 4), 256)
    assert chain_ok(header)
    assert payload_ok(header, memoryview(payload))
    assert not payload_ok(header, memoryview(payload[:-1] + b"\0"))


def test_zero_header_is_a_free_slot() -> None:
    assert decode_header(bytes(BLOCK.header_bytes), PAGE_SIZE) is None


def test_no_torn_header_ever_verifies() -> None:
    """Every strict prefix of a new header over an empty slot, or over an old header, fails."""
    _, new = _header(b"new" * 50, tokens=(5, 6, 7, 8))
    _, old = _header(b"old" * 50)
    checked = 0
    for keep in range(1, BLOCK.header_bytes):
        for underneath in (bytes(BLOCK.header_bytes), old):
            torn = new[:keep] + underneath[keep:]
            if torn not in (new, old):  # a tear inside the zero padding is the whole header
                assert decode_header(torn, PAGE_SIZE) is None, keep
                checked += 1
    assert checked >= 2 * 70


@pytest.mark.parametrize("offset", [4, 8, 16, 32, 48, 60, 64, 72])
def test_flipped_header_byte_never_verifies(offset: int) -> None:
    _, data = _header(b"x" * 256)
    corrupt = bytearray(data)
    corrupt[offset] ^= 0x10
    assert decode_header(bytes(corrupt), PAGE_SIZE) is None


def test_key_that_does_not_chain_is_detected() -> None:
    parent = bytes(16)
    wrong_key = page_key(parent, (9, 9, 9, 9))
    data = encode_header(BLOCK.header_bytes, 0, wrong_key, parent, (1, 2, 3, 4), memoryview(b"p"))
    header = decode_header(data, PAGE_SIZE)
    assert header is not None and not chain_ok(header)


def test_header_tokens_are_int32_little_endian() -> None:
    _, data = _header(b"p", tokens=(70000, 1, 2, 3))
    assert np.frombuffer(data, dtype="<i4", count=4, offset=48).tolist() == [70000, 1, 2, 3]


def test_a_record_says_whether_it_holds_the_sliding_layers() -> None:
    payload = memoryview(bytes(range(64)))
    parent = b"\x01" * 16
    key = page_key(parent, (1, 2, 3, 4))
    whole = decode_header(
        encode_header(BLOCK.header_bytes, 0, key, parent, (1, 2, 3, 4), payload), PAGE_SIZE
    )
    assert whole is not None and whole.sliding_held
    raw = encode_header(BLOCK.header_bytes, 0, key, parent, (1, 2, 3, 4), payload, False)
    without = decode_header(raw, PAGE_SIZE)
    assert without is not None and not without.sliding_held and payload_ok(without, payload)
    assert raw[5] == 1 and whole.fields != without.fields  # under both checksums
    # a flag this build does not know, under valid checksums, is a corrupt header
    tokens = np.asarray((1, 2, 3, 4), dtype="<i4")
    unknown = _sealed(disk_format._fields(0, 4, 0, len(payload), key, parent, tokens), payload)
    assert decode_header(unknown, PAGE_SIZE) is None


def _sealed(fields: bytes, payload: memoryview) -> bytes:
    """A header of `fields` under valid record and header checksums."""
    with_sum = fields + struct.pack("<Q", record_checksum(fields, payload))
    return (with_sum + xxhash.xxh3_64_digest(with_sum)).ljust(BLOCK.header_bytes, b"\0")


def test_a_layer_record_names_its_layer_under_both_checksums() -> None:
    payload = memoryview(bytes(range(64)))
    parent = b"\x01" * 16
    key = page_key(parent, (1, 2, 3, 4))
    raw = encode_header(BLOCK.header_bytes, 0, key, parent, (1, 2, 3, 4), payload, layer=3)
    header = decode_header(raw, PAGE_SIZE)
    assert header is not None and header.layer == 3 and header.sliding_held
    assert raw[5] == disk_format.LAYER_RECORD and struct.unpack_from("<H", raw, 6) == (3,)
    assert payload_ok(header, payload)
    layer_zero = decode_header(
        encode_header(BLOCK.header_bytes, 0, key, parent, (1, 2, 3, 4), payload, layer=0),
        PAGE_SIZE,
    )
    assert layer_zero is not None and layer_zero.layer == 0  # the flag, not the value, says so
    whole = decode_header(
        encode_header(BLOCK.header_bytes, 0, key, parent, (1, 2, 3, 4), payload), PAGE_SIZE
    )
    assert whole is not None and whole.layer is None
    assert len({header.fields, layer_zero.fields, whole.fields}) == 3
    # a layer number without the flag, under valid checksums, is a corrupt header
    tokens = np.asarray((1, 2, 3, 4), dtype="<i4")
    stray = _sealed(disk_format._fields(0, 0, 3, len(payload), key, parent, tokens), payload)
    assert decode_header(stray, PAGE_SIZE) is None
