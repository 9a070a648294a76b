"""PageFreeList: LIFO page ids, lowest first from a fresh list, pages moved in batches, double
frees caught (and refused without a change), and the pages a warm restart finds live taken out
of the list."""

from __future__ import annotations

import random

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


def test_a_fresh_list_hands_out_the_lowest_ids_and_freed_pages_come_back_last_first() -> None:
    free_list = PageFreeList(8, "device")
    assert free_list.alloc(3) == [0, 1, 2] and free_list.alloc(0) == []
    free_list.free([2, 0])
    assert free_list.alloc(2) == [0, 2]  # popped from the end, as one by one
    assert free_list.alloc(4) == [3, 4, 5, 6] and free_list.used_pages() == [0, 1, 2, 3, 4, 5, 6]
    assert free_list.num_free == 1 and free_list.num_used == 7
    with pytest.raises(OutOfPagesError):
        free_list.alloc(2)
    assert free_list.num_free == 1 and free_list.is_free(7) and not free_list.is_free(0)


@pytest.mark.parametrize("bad", [[5], [1, 5], [1, 1], [2, 3, 2], [8], [-1]], ids=str)
def test_a_double_free_is_refused_and_changes_nothing(bad: list[int]) -> None:
    free_list = PageFreeList(8, "host")
    free_list.alloc(4)  # 0-3 used, 4-7 free
    with pytest.raises(AssertionError, match="host page"):
        free_list.free(bad)
    assert free_list.used_pages() == [0, 1, 2, 3] and free_list.num_free == 4
    free_list.free([3, 1])
    assert free_list.alloc(2) == [1, 3]


def test_random_batches_match_a_page_by_page_model() -> None:
    rng = random.Random(3)
    free_list = PageFreeList(64, "disk")
    stack = list(range(63, -1, -1))  # the model: pop and push one page at a time
    held: list[int] = []
    for _ in range(500):
        if held and rng.random() < 0.5:
            rng.shuffle(held)
            count = rng.randint(1, len(held))
            batch, held = held[:count], held[count:]
            free_list.free(batch)
            stack.extend(batch)
        else:
            count = rng.randint(0, len(stack))
            got = free_list.alloc(count)
            assert got == [stack.pop() for _ in range(count)]
            held += got
        assert free_list.used_pages() == sorted(held) and free_list.num_free == len(stack)
