"""Page keys computed from one byte buffer equal the per-page chain they replace."""

import hashlib
import random

import numpy as np

from tieredkv.cache.index.page_key import (
    KEY_BYTES,
    chain_keys,
    namespace_root_key,
    page_key,
    token_bytes,
)


def _reference_chain(parent: bytes, tokens: list[int], page_size: int) -> list[bytes]:
    keys = []
    for start in range(0, len(tokens) - page_size + 1, page_size):
        h = hashlib.blake2b(digest_size=KEY_BYTES, person=b"tieredkv-page")
        h.update(parent)
        h.update(np.asarray(tokens[start : start + page_size], dtype="<i4").tobytes())
        parent = h.digest()
        keys.append(parent)
    return keys


def test_chain_keys_equal_the_numpy_per_page_chain() -> None:
    rng = random.Random(3)
    root = namespace_root_key(b"fp", "ns")
    for page_size in (1, 4, 16):
        tokens = [rng.randint(-(2**31), 2**31 - 1) for _ in range(page_size * 9 + 3)]
        expected = _reference_chain(root, tokens, page_size)
        assert len(expected) == len(tokens) // page_size >= 9
        assert chain_keys(root, tokens, page_size) == expected
        assert chain_keys(root, tuple(tokens), page_size) == expected
        assert page_key(expected[0], tokens[page_size : 2 * page_size]) == expected[1]


def test_token_bytes_are_int32_little_endian() -> None:
    tokens = [0, 1, 49151, -1, 2**31 - 1]
    assert token_bytes(tokens) == np.asarray(tokens, dtype="<i4").tobytes()
    assert token_bytes([]) == b""


def test_namespace_root_key_is_stable_across_calls() -> None:
    first = namespace_root_key(b"fp", "ns")
    h = hashlib.blake2b(digest_size=KEY_BYTES, person=b"tieredkv-ns")
    h.update((2).to_bytes(4, "little") + b"fp" + b"ns")
    assert first == h.digest() == namespace_root_key(b"fp", "ns")
    assert namespace_root_key(b"fp", "other") != first
