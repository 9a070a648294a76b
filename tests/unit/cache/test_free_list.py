"""PageFreeList: LIFO page ids, lowest first from a fresh list, double frees caught, and the
pages a warm restart finds live taken out of the list."""

from __future__ import annotations

import pytest

from tieredkv.cache.pools.free_list import PageFreeList
from tieredkv.errors import OutOfPagesError


def test_a_fresh_list_hands_out_the_lowest_pages_first() -> None:
    pages = PageFreeList(6, "test")
    assert pages.alloc(2) == [0, 1] and pages.num_free == 4 and pages.num_used == 2
    with pytest.raises(OutOfPagesError):
        pages.alloc(5)
    assert pages.num_free == 4  # all or nothing
    pages.free([1])
    assert pages.alloc(1) == [1]  # last freed, first out
    assert pages.used_pages() == [0, 1]


def test_take_marks_pages_used_and_keeps_the_rest_in_order() -> None:
    pages = PageFreeList(8, "test")
    pages.take([5, 0, 3])
    assert pages.num_free == 5 and pages.used_pages() == [0, 3, 5]
    assert not pages.is_free(3) and pages.is_free(4)
    assert pages.alloc(5) == [1, 2, 4, 6, 7]  # lowest free first, as from a fresh list


def test_double_free_and_taking_a_used_page_are_caught() -> None:
    pages = PageFreeList(4, "test")
    (page,) = pages.alloc(1)
    pages.free([page])
    with pytest.raises(AssertionError, match="freed twice"):
        pages.free([page])
    pages.take([2])
    with pytest.raises(AssertionError, match="taken while in use"):
        pages.take([2])
