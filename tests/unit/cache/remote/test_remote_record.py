"""The remote value format, without Redis: what decodes and what is refused, and why."""

from __future__ import annotations

import pytest

from tests.unit.cache.remote.conftest import FINGERPRINT, PAGE_BYTES, PAGE_SIZE, make_pages
from tieredkv.cache.page_record import LZ4, RAW, fingerprint_digest
from tieredkv.cache.remote.keys import KEY_PREFIX, redis_key
from tieredkv.cache.remote.record import RefusalReason, decode_value, encode_value

DIGEST = fingerprint_digest(FINGERPRINT)


def decode(value: bytes, key: bytes):
    return decode_value(value, key, DIGEST, PAGE_SIZE, PAGE_BYTES)


@pytest.mark.parametrize("codec", [RAW, LZ4])
def test_round_trip(codec: int) -> None:
    for page in make_pages(2, compressible=True):
        value = encode_value(page, DIGEST, codec)
        assert (len(value) < PAGE_BYTES) == (codec == LZ4)
        assert decode(value, page.key).data == page.data


def test_incompressible_page_is_stored_raw() -> None:
    page = make_pages(1)[0]
    value = encode_value(page, DIGEST, LZ4)
    assert value[5] == RAW and decode(value, page.key).data == page.data


@pytest.mark.parametrize("codec", [RAW, LZ4])
def test_every_flipped_byte_region_is_refused(codec: int) -> None:
    page = make_pages(1, compressible=True)[0]
    value = encode_value(page, DIGEST, codec)
    for offset in (0, 5, 20, 50, 70, 90, len(value) // 2, len(value) - 1):
        bad = bytearray(value)
        bad[offset] ^= 0x01
        result = decode(bytes(bad), page.key)
        assert result.data is None and result.refused is not None, offset
    assert decode(value[:-1], page.key).refused is RefusalReason.CORRUPT
    assert decode(b"garbage", page.key).refused is RefusalReason.CORRUPT


def test_identity_is_checked() -> None:
    first, second = make_pages(2)
    value = encode_value(first, DIGEST, RAW)
    assert decode(value, second.key).refused is RefusalReason.KEY
    other = encode_value(first, fingerprint_digest(b"another model"), RAW)
    assert decode(other, first.key).refused is RefusalReason.FINGERPRINT
    assert decode_value(value, first.key, DIGEST, PAGE_SIZE, PAGE_BYTES // 2).refused is (
        RefusalReason.FINGERPRINT
    )


def test_a_record_whose_key_is_not_its_chain_is_refused() -> None:
    first, second = make_pages(2)
    forged = type(first)(first.key, second.parent_key, first.tokens, first.data)
    assert decode(encode_value(forged, DIGEST, RAW), first.key).refused is RefusalReason.KEY


def test_key_names_reveal_no_tokens() -> None:
    page = make_pages(1)[0]
    name = redis_key(page.key)
    assert name == KEY_PREFIX + page.key.hex()
    assert len(name) == len(KEY_PREFIX) + 32  # a fixed-length hash, whatever the tokens
