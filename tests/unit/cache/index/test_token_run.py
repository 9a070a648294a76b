"""`PackedTokens` and `TokenPacker`: the packed form the tree compares, and its bytes."""

import numpy as np
import pytest

from tieredkv.cache.index.page_key import token_bytes
from tieredkv.cache.index.token_run import PackedTokens, TokenPacker, packed_bytes

IDS = [5, 0, 49151, -1, 2**31 - 1, -(2**31), 7, 8, 9]


def test_packed_bytes_are_the_page_key_bytes() -> None:
    packed = PackedTokens.from_ids(IDS)
    assert packed.data == token_bytes(IDS) == np.asarray(IDS, dtype="<i4").tobytes()
    assert len(packed) == len(IDS)
    assert packed.ids() == IDS and list(packed) == IDS
    assert packed_bytes(packed) is packed.data
    assert packed_bytes(IDS) == packed.data and packed_bytes(tuple(IDS)) == packed.data


def test_indexing_and_slicing_follow_the_ids() -> None:
    packed = PackedTokens.from_ids(IDS)
    for index in range(-len(IDS), len(IDS)):
        assert packed[index] == IDS[index]
    for start, stop in [(0, 4), (2, 9), (3, 3), (5, 2), (-4, None), (None, -2), (0, 100)]:
        piece = packed[start:stop]
        assert isinstance(piece, PackedTokens)
        assert piece.ids() == IDS[start:stop]
    with pytest.raises(IndexError):
        packed[len(IDS)]
    with pytest.raises(ValueError, match="step 1"):
        packed[::2]


def test_equality_hash_and_concatenation() -> None:
    a, b = PackedTokens.from_ids(IDS[:4]), PackedTokens.from_ids(IDS[4:])
    assert a + b == PackedTokens.from_ids(IDS)
    assert hash(a + b) == hash(PackedTokens.from_ids(IDS))
    assert a != b and a != IDS[:4]  # never equal to a list: compare ids() explicitly
    assert "9 tokens" in repr(a + b)


def test_refuses_bytes_that_are_not_whole_tokens() -> None:
    with pytest.raises(ValueError, match="int32"):
        PackedTokens(b"\x00" * 6)
    assert len(PackedTokens(b"")) == 0


def test_packer_grows_and_snapshots() -> None:
    packer = TokenPacker(IDS[:3])
    first = packer.packed()
    assert first.ids() == IDS[:3] and packer.packed() is first  # no copy without growth
    packer.append(IDS[3])
    packer.extend(IDS[4:7])
    packer.extend([])
    second = packer.packed()
    assert second.ids() == IDS[:7] and len(packer) == 7
    assert first.ids() == IDS[:3]  # an earlier snapshot never changes
    assert TokenPacker().packed() == PackedTokens(b"")
