"""Workspaces: the fill from the paged pool equals a plain gather; released ones are reused."""

import random

import pytest
import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.model.workspace import SpareWorkspaces, Workspace, WorkspaceArena, fill_helper


def gathered(pool: DevicePool, pages: list[int], length: int) -> torch.Tensor:
    """The reference: (layers, 2, kv_heads, length, head_dim) by indexing page by page."""
    kv = torch.cat([pool.kv[:, :, page] for page in pages], dim=2)  # (L, 2, n * ps, H, D)
    return kv[:, :, :length].transpose(2, 3)


def random_pool(dtype: torch.dtype, num_pages: int = 80) -> DevicePool:
    pool = DevicePool(PageLayout(3, 2, 8, 16, dtype), num_pages, "cpu")
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(1)))
    return pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [1, 16, 37, 511, 512, 700, 1024])  # both sides of 2 threads
@pytest.mark.parametrize("order", ["consecutive", "shuffled", "runs"])
def test_fill_equals_gather(dtype: torch.dtype, length: int, order: str) -> None:
    pool = random_pool(dtype)
    num_pages = -(-length // 16)
    if order == "consecutive":
        pages = list(range(5, 5 + num_pages))
    elif order == "shuffled":
        pages = random.Random(length).sample(range(pool.num_pages), num_pages)
    else:  # runs of 3 consecutive pages in a scattered order
        starts = random.Random(length).sample(range(0, 78, 3), -(-num_pages // 3))
        pages = [s + i for s in starts for i in range(3)][:num_pages]
    workspace = Workspace.for_tokens(pool, 64)  # smaller: the fill grows it
    workspace.kv.fill_(7)
    with fill_helper() as helper:
        workspace.fill_from_pool(pool, [*pages, 0, 1], length, helper)  # extra ids are ignored
    assert workspace.length == length and workspace.capacity >= length
    assert torch.equal(workspace.kv[:, :, :, :length], gathered(pool, pages, length))


def test_spares_are_reused_smallest_fitting_first_and_bounded() -> None:
    pool = random_pool(torch.float32)
    spares = SpareWorkspaces(pool, keep=2)
    small, big = Workspace.for_tokens(pool, 100), Workspace.for_tokens(pool, 1000)
    small.length = big.length = 50
    spares.give(big)
    spares.give(small)
    assert spares.take(300) is big and big.length == 0  # the small one (256) does not fit
    assert spares.take(10) is small
    assert spares.take(10) is not small and len(spares) == 0  # none left: a new one
    for tokens in (300, 600, 900):
        spares.give(Workspace.for_tokens(pool, tokens))
    assert len(spares) == 2 and spares.take(1).capacity >= 600  # the smallest was dropped


def test_arena_slots_start_zeroed_whatever_the_allocator_held() -> None:
    """The batched decode multiplies masked keys' values by 0, and 0 x NaN is NaN: a slot must
    never hold non-finite garbage past a sequence's end, even in memory the allocator recycles."""
    pool = random_pool(torch.float32)
    for _ in range(4):  # leave freed NaN-filled blocks behind for the allocator to hand out
        torch.full((3, 2, 2, 512, 8), float("nan"))
    arena = WorkspaceArena(pool, slots=3, capacity=300)
    assert arena.capacity == 512 and torch.count_nonzero(arena.kv) == 0
    first, second = arena.take(100), arena.take(600)
    assert first is not None and first.slot == 0 and second is None  # longer than a slot
    other = arena.take(10)
    assert other is not None and other.slot == 1
    arena.give(first)
    assert arena.take(10).slot == 0  # the lowest free slot first


def written_slot(arena: WorkspaceArena, pool: DevicePool, pages: list[int], tokens: int):
    """A slot that took `tokens` tokens' KV from `pages` (as a finished prefill leaves it)."""
    workspace = arena.take(tokens)
    assert workspace is not None
    workspace.fill_from_pool(pool, pages, tokens)
    workspace.mirrors.extend(pool, pages, -(-tokens // 16))
    return workspace


@pytest.mark.parametrize("tokens", [16, 100, 160])
def test_a_released_slot_serves_a_new_sequence_the_pages_it_still_holds(tokens: int) -> None:
    pool = random_pool(torch.float32)
    arena = WorkspaceArena(pool, slots=3, capacity=300)
    pages = pool.alloc(-(-tokens // 16))
    arena.give(written_slot(arena, pool, pages, tokens))
    held = tokens // 16 * 16  # whole pages only: a partial last page is not kept
    workspace = arena.take(tokens + 40, [*pages, *pool.alloc(3)], tokens)
    assert workspace is not None and workspace.slot == 0
    assert workspace.length == held and arena.reused_tokens == held
    workspace.fill_from_pool(pool, pages, tokens)  # only what it lacks
    assert torch.equal(workspace.kv[:, :, :, :tokens], gathered(pool, pages, tokens))


def test_a_slot_whose_pages_were_allocated_again_is_not_trusted_from_there_on() -> None:
    pool = random_pool(torch.float32)
    arena = WorkspaceArena(pool, slots=3, capacity=300)
    pages = pool.alloc(8)
    arena.give(written_slot(arena, pool, pages, 128))
    pool.free(pages[5:])
    again = pool.alloc(3)  # the same ids (LIFO), another allocation: new KV
    assert sorted(again) == sorted(pages[5:])
    pool.kv[:, :, again] = torch.randn(pool.kv[:, :, again].shape)
    workspace = arena.take(128, pages, 128)
    assert workspace is not None and workspace.length == 5 * 16
    workspace.fill_from_pool(pool, pages, 128)
    assert torch.equal(workspace.kv[:, :, :, :128], gathered(pool, pages, 128))


def test_a_new_sequence_takes_the_slot_that_holds_its_prefix_else_the_lowest_free() -> None:
    pool = random_pool(torch.float32)
    arena = WorkspaceArena(pool, slots=3, capacity=300)
    ours, other = pool.alloc(4), pool.alloc(4)
    first = written_slot(arena, pool, other, 64)
    second = written_slot(arena, pool, ours, 64)
    arena.give(first)
    arena.give(second)
    mine = arena.take(80, [*ours, *pool.alloc(1)], 64)
    assert mine is not None and mine.slot == 1 and mine.length == 64
    partly = arena.take(60, [other[0], *ours[1:3]], 48)  # slot 0 holds its first page
    assert partly is not None and partly.slot == 0 and partly.length == 16
    fresh = arena.take(80, pool.alloc(5), 64)  # no slot holds it: the lowest free one
    assert fresh is not None and fresh.slot == 2 and fresh.length == 0
