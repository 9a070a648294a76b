"""The remote value format, without Redis: what decodes and what is refused, and why; names
and seals that depend on the deployment secret; values that hold no token."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.unit.cache.remote.conftest import FINGERPRINT, PAGE_BYTES, PAGE_SIZE, make_pages
from tieredkv.cache.page_record import LZ4, RAW, fingerprint_digest
from tieredkv.cache.remote.keys import KEY_PREFIX, redis_key
from tieredkv.cache.remote.record import RefusalReason, RemotePage, decode_value, encode_value
from tieredkv.cache.remote.secret import StoreKeys

SECRET = b"a-deployment-secret-0123456789"
KEYS = StoreKeys.derive(SECRET, fingerprint_digest(FINGERPRINT))


def named(page: RemotePage, keys: StoreKeys = KEYS) -> RemotePage:
    """The page as the store hands it to the writer: under its stored name."""
    return dataclasses.replace(page, key=keys.name(page.key))


def decode(value: bytes, page: RemotePage, keys: StoreKeys = KEYS):
    return decode_value(value, keys.name(page.key), keys, PAGE_SIZE, PAGE_BYTES)


@pytest.mark.parametrize("codec", [RAW, LZ4])
def test_round_trip(codec: int) -> None:
    for page in make_pages(2, compressible=True):
        value = encode_value(named(page), KEYS, codec)
        assert (len(value) < PAGE_BYTES) == (codec == LZ4)
        assert decode(value, page).data == page.data


def test_incompressible_page_is_stored_raw() -> None:
    page = make_pages(1)[0]
    value = encode_value(named(page), KEYS, LZ4)
    assert value[5] == RAW and decode(value, page).data == page.data


@pytest.mark.parametrize("codec", [RAW, LZ4])
def test_every_flipped_byte_region_is_refused(codec: int) -> None:
    page = make_pages(1, compressible=True)[0]
    value = encode_value(named(page), KEYS, codec)
    for offset in (0, 5, 12, 20, 40, 70, 90, len(value) // 2, len(value) - 1):
        bad = bytearray(value)
        bad[offset] ^= 0x01
        result = decode(bytes(bad), page)
        assert result.data is None and result.refused is not None, offset
    assert decode(value[:-1], page).refused is RefusalReason.CORRUPT
    assert decode(b"garbage", page).refused is RefusalReason.CORRUPT


def test_a_forged_payload_with_a_valid_header_fails_the_mac() -> None:
    """What an unkeyed checksum let through: the header kept, the payload zeroed."""
    page = make_pages(1)[0]
    value = bytearray(encode_value(named(page), KEYS, RAW))
    value[64:] = bytes(len(value) - 64)
    assert decode(bytes(value), page).refused is RefusalReason.MAC


def test_a_value_sealed_with_another_secret_or_model_fails_the_mac() -> None:
    page = make_pages(1)[0]
    other = StoreKeys.derive(b"another-deployment-secret-xyz", fingerprint_digest(FINGERPRINT))
    foreign = encode_value(named(page), other, RAW)  # planted under this deployment's name
    assert decode(foreign, page).refused is RefusalReason.MAC
    model = StoreKeys.derive(SECRET, fingerprint_digest(b"another model"))
    assert decode(encode_value(named(page), model, RAW), page).refused is RefusalReason.MAC
    unsealed = StoreKeys.derive(None, fingerprint_digest(FINGERPRINT))
    assert decode(encode_value(named(page), unsealed, RAW), page).refused is RefusalReason.MAC


def test_a_sealed_value_replayed_under_another_name_is_refused() -> None:
    first, second = make_pages(2)
    value = encode_value(named(first), KEYS, RAW)
    assert decode(value, second).refused is RefusalReason.KEY
    assert decode_value(value, KEYS.name(first.key), KEYS, PAGE_SIZE, PAGE_BYTES // 2).refused is (
        RefusalReason.FINGERPRINT
    )


def test_values_hold_no_token_and_names_need_the_secret() -> None:
    page = make_pages(1)[0]
    value = encode_value(named(page), KEYS, RAW)
    tokens = np.asarray(page.tokens, dtype="<i4").tobytes()
    assert tokens not in value and page.key not in value and page.parent_key not in value
    name = redis_key(KEYS.name(page.key))
    assert name == KEY_PREFIX + KEYS.name(page.key).hex()
    assert len(name) == len(KEY_PREFIX) + 32  # a fixed-length hash, whatever the tokens
    assert page.key.hex() not in name
    other = StoreKeys.derive(b"another-deployment-secret-xyz", fingerprint_digest(FINGERPRINT))
    assert other.name(page.key) != KEYS.name(page.key)
