"""A promoted sequence's workspace slot filled while its pages land: what landed is used only
where the sequence's page is that same allocation; everything else is copied from the pool."""

import threading

import numpy as np
import pytest
import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.model.promotion_fill import PromotionFills
from tieredkv.model.workspace import Workspace, WorkspaceArena, fill_helper


def gathered(pool: DevicePool, pages: list[int], length: int) -> torch.Tensor:
    kv = torch.cat([pool.kv[:, :, page] for page in pages], dim=2)
    return kv[:, :, :length].transpose(2, 3)


def random_pool(num_pages: int = 80) -> DevicePool:
    pool = DevicePool(PageLayout(3, 2, 8, 16, torch.float32), num_pages, "cpu")
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(2)))
    return pool


def fills_over(slots: int, capacity: int) -> tuple[DevicePool, WorkspaceArena, PromotionFills]:
    pool = random_pool()
    arena = WorkspaceArena(pool, slots=slots, capacity=capacity)
    return pool, arena, PromotionFills(pool, arena)


def take_and_fill(
    fills: PromotionFills, seq_id: int, sequence: list[int], tokens: int, helper=None
) -> tuple[Workspace, np.ndarray]:
    """The first chunk's part: take the slot, copy what did not land, and check the slot now
    equals a plain gather of the sequence's pages."""
    taken = fills.take(seq_id, sequence)
    assert taken is not None
    workspace, holds = taken
    workspace.fill_from_pool(fills.pool, sequence, tokens, helper, holds)
    assert torch.equal(workspace.kv[:, :, :, :tokens], gathered(fills.pool, sequence, tokens))
    return workspace, holds


def test_fill_skips_the_landed_positions_and_copies_the_others() -> None:
    pool = random_pool()
    pages = pool.alloc(10)
    workspace = Workspace.for_tokens(pool, 160)
    landed = np.zeros(10, dtype=bool)
    landed[[0, 3, 4, 9]] = True
    workspace.kv.fill_(7)
    workspace.fill_from_pool(pool, pages, 150, None, landed)
    expected = gathered(pool, pages, 150)
    for position in range(10):
        tokens = slice(position * 16, min(position * 16 + 16, 150))
        held = workspace.kv[:, :, :, tokens]
        if landed[position]:
            assert bool((held == 7).all())  # left alone: the caller said it is there
        else:
            assert torch.equal(held, expected[:, :, :, tokens])
    assert workspace.length == 150


@pytest.mark.parametrize("helper", [False, True])
def test_pages_landing_in_any_order_then_the_rest_equal_a_plain_fill(helper: bool) -> None:
    pool, _, fills = fills_over(2, 1024)
    pages = pool.alloc(40)  # 640 tokens: long enough for the two-thread fill
    planned: list[int | None] = list(pages)
    planned[5] = None  # already on the device: not read, never lands
    assert fills.expect(7, planned)
    fills.landed([pages[i] for i in (30, 31, 32, 2, 3)])
    fills.landed([pages[i] for i in range(10, 20)])
    fills.landed([pages[5], 9999])  # not expected (or another sequence's): ignored
    assert fills.landed_pages == 15
    with fill_helper() as threads:
        _, holds = take_and_fill(fills, 7, pages, 630, threads if helper else None)
    assert holds.sum() == 15 and not holds[5] and holds[2] and holds[32]
    assert fills.take(7, pages) is None and len(fills) == 0


def test_a_landed_page_freed_and_allocated_again_is_copied_again() -> None:
    pool, _, fills = fills_over(2, 512)
    pages = pool.alloc(8)
    assert fills.expect(1, pages)
    fills.landed(pages)
    pool.free(pages[6:])  # say their transfer failed: freed, then someone else's KV there
    again = pool.alloc(2)
    assert sorted(again) == sorted(pages[6:])
    pool.kv[:, :, again] = torch.randn(pool.kv[:, :, again].shape)
    _, holds = take_and_fill(fills, 1, pages, 128)
    assert holds.tolist() == [True] * 6 + [False] * 2


def test_a_sequence_whose_pages_changed_uses_only_the_positions_still_matching() -> None:
    """The tree can hand the sequence another copy of a page (a duplicate freed for the tree's
    own): a position counts only if the sequence's page is the one that landed."""
    pool, _, fills = fills_over(2, 512)
    pages, other = pool.alloc(4), pool.alloc(1)
    assert fills.expect(3, pages)
    fills.landed(pages)
    _, holds = take_and_fill(fills, 3, [pages[0], other[0], pages[2], pages[3]], 64)
    assert holds.tolist() == [True, False, True, True]


def test_a_cancelled_sequence_frees_its_slot_holding_nothing() -> None:
    pool, arena, fills = fills_over(1, 256)
    pages = pool.alloc(4)
    assert fills.expect(1, pages)
    assert arena.take(16) is None  # the only slot is reserved
    assert not fills.expect(2, pool.alloc(2))  # none left: nothing reserved
    fills.landed(pages)
    fills.cancel(1)
    fills.landed(pages)  # a late landing after the cancel: nobody expects it now
    taken = arena.take(64, pages, 64)
    assert taken is not None and taken.length == 0  # the slot is free and claims nothing


def test_a_reservation_prefers_a_slot_that_remembers_no_chat() -> None:
    pool = random_pool()
    arena = WorkspaceArena(pool, slots=3, capacity=256)
    chat = pool.alloc(2)
    kept, plain = arena.take(32), arena.take(32)
    assert kept is not None and kept.slot == 0 and plain is not None
    kept.fill_from_pool(pool, chat, 32)
    kept.mirrors.extend(pool, chat, 2)
    plain.length = 32  # written as far, holding nothing it could serve
    arena.give(kept)
    arena.give(plain)
    fills = PromotionFills(pool, arena)
    assert fills.expect(5, pool.alloc(2))
    taken = arena.take(32, chat, 32)
    assert taken is not None and taken.slot == 0 and taken.length == 32  # still the chat's


def test_take_waits_for_a_copy_into_the_slot_that_already_started() -> None:
    pool = random_pool()
    arena = WorkspaceArena(pool, slots=1, capacity=512)
    fills = PromotionFills(pool, arena)
    pages = pool.alloc(20)
    assert fills.expect(1, pages)
    started, release = threading.Event(), threading.Event()
    original = Workspace.fill_pages

    def slow_fill(self, *args):  # a stand-in that blocks mid-copy
        started.set()
        release.wait(5)
        original(self, *args)

    Workspace.fill_pages = slow_fill  # type: ignore[method-assign]
    try:
        transfer_jobs = threading.Thread(target=fills.landed, args=(pages,))
        transfer_jobs.start()
        assert started.wait(5)
        taken: list = []
        taker = threading.Thread(target=lambda: taken.append(fills.take(1, pages)))
        taker.start()
        taker.join(0.2)
        assert taker.is_alive()  # the copy is still running: the slot is not handed over
        release.set()
        transfer_jobs.join(5)
        taker.join(5)
    finally:
        Workspace.fill_pages = original  # type: ignore[method-assign]
    workspace, holds = taken[0]
    assert bool(holds.all())
    assert torch.equal(workspace.kv[:, :, :, :320], gathered(pool, pages, 320))


def test_a_promotion_whose_head_is_on_the_device_takes_the_slot_still_holding_it() -> None:
    pool = random_pool()
    arena = WorkspaceArena(pool, slots=3, capacity=512)
    head = pool.alloc(4)  # the chat's first turn, still on the device
    for _ in range(2):  # two other slots in use, then released holding nothing
        other = arena.take(16)
        assert other is not None
        arena.give(other)
    kept = arena.take(64)
    assert kept is not None
    kept.fill_from_pool(pool, head, 64)
    kept.mirrors.extend(pool, head, 4)
    arena.give(kept)
    fills = PromotionFills(pool, arena)
    read = pool.alloc(6)  # the rest comes from disk
    assert fills.expect(9, [*head, *read])
    fills.landed(read)
    taken = fills.take(9, [*head, *read])
    assert taken is not None
    workspace, holds = taken
    assert workspace.slot == kept.slot and workspace.length == 64
    assert holds.tolist() == [False] * 4 + [True] * 6
    workspace.fill_from_pool(pool, [*head, *read], 160, None, holds)
    assert torch.equal(workspace.kv[:, :, :, :160], gathered(pool, [*head, *read], 160))


def test_an_empty_reservation_takes_a_slot_already_written_that_far() -> None:
    """A first touch of a slot's memory faults it in (slow in a VM): a reservation takes a
    slot a sequence already wrote that far, holding no chat if it can."""
    pool = random_pool()
    arena = WorkspaceArena(pool, slots=4, capacity=512)
    short, long, chat = arena.take(16), arena.take(16), arena.take(16)
    assert short is not None and long is not None and chat is not None
    short.length, long.length = 32, 320
    pages = pool.alloc(20)
    chat.fill_from_pool(pool, pages, 320)
    chat.mirrors.extend(pool, pages, 20)
    for workspace in (short, long, chat):
        arena.give(workspace)
    fills = PromotionFills(pool, arena)
    assert fills.expect(1, pool.alloc(16))  # 256 tokens: slots 1 and 2 were written that far
    workspace, _ = fills.take(1, [])  # type: ignore[misc]
    assert workspace.slot == long.slot  # not the chat's, not the short one, not untouched 3
