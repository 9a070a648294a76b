"""What both stores record with a page: the codec numbers, the fingerprint digest and the record
checksum are pinned to their stored values (both stores' files and values depend on them), and
a payload decodes to the page it was encoded from, or to nothing."""

from __future__ import annotations

import numpy as np
import pytest

from tieredkv.cache.page_record import (
    CODEC_NAMES,
    CODECS,
    LZ4,
    RAW,
    decode_payload,
    encode_payload,
    fingerprint_digest,
    record_checksum,
)

PAGE_BYTES = 4096
RANDOM_PAGE = memoryview(np.random.default_rng(0).integers(0, 256, PAGE_BYTES, dtype=np.uint8))
ZERO_PAGE = memoryview(bytes(PAGE_BYTES))


def test_stored_values_are_pinned() -> None:
    assert CODECS == {"raw": 0, "lz4": 1} and CODEC_NAMES == {0: "raw", 1: "lz4"}
    assert (RAW, LZ4) == (0, 1)
    digest = fingerprint_digest(b"model")
    assert digest.hex() == "a581376ad0efe996a98552f125069b51c4a0ca0f0e779db6b6a231ba53906a03"
    assert record_checksum(b"fields", memoryview(b"payload")) == 4711133219045409734


def test_raw_is_stored_as_it_is_and_decodes_without_a_copy() -> None:
    codec, payload = encode_payload(RANDOM_PAGE, RAW)
    assert codec == RAW and payload is RANDOM_PAGE
    assert decode_payload(RAW, payload, PAGE_BYTES) is payload


@pytest.mark.parametrize(("page", "stored_as"), [(ZERO_PAGE, LZ4), (RANDOM_PAGE, RAW)])
def test_lz4_is_kept_only_where_it_shrinks_the_page(page: memoryview, stored_as: int) -> None:
    codec, payload = encode_payload(page, LZ4)
    assert codec == stored_as and payload.nbytes <= PAGE_BYTES
    assert (payload.nbytes < PAGE_BYTES) == (stored_as == LZ4)
    decoded = decode_payload(codec, payload, PAGE_BYTES)
    assert decoded is not None and bytes(decoded) == bytes(page)


def test_a_payload_that_is_not_one_page_decodes_to_nothing() -> None:
    _, packed = encode_payload(ZERO_PAGE, LZ4)
    assert decode_payload(RAW, RANDOM_PAGE[:-1], PAGE_BYTES) is None  # short
    assert decode_payload(LZ4, packed, PAGE_BYTES * 2) is None  # decodes to less
    assert decode_payload(LZ4, memoryview(b"\xff" * 64), PAGE_BYTES) is None  # not lz4
    assert decode_payload(7, RANDOM_PAGE, PAGE_BYTES) is None  # no such codec
