"""The workspaces' share of the device budget, and released slots giving their memory back."""

import pytest
import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.config import CacheConfig, EngineConfig
from tieredkv.errors import ConfigError
from tieredkv.model.workspace import Workspace, WorkspaceArena
from tieredkv.model.workspace_budget import SlotBudget, carve_workspace, workspace_budget_bytes

TOKEN = 1000  # bytes a token


def test_the_default_share_is_what_the_running_sequences_can_need() -> None:
    # half the budget: the pool keeps the other half, which is all the running KV can fill
    assert workspace_budget_bytes(100_000 * TOKEN, TOKEN, max_seqs=16, max_len=8192) == (
        50_000 * TOKEN
    )
    # max_num_seqs x max_model_len when that is less
    assert workspace_budget_bytes(100_000 * TOKEN, TOKEN, max_seqs=2, max_len=8192) == (
        16_384 * TOKEN
    )
    # the pool keeps one whole sequence first
    assert workspace_budget_bytes(10_000 * TOKEN, TOKEN, max_seqs=16, max_len=8192) == (
        1_808 * TOKEN
    )


def test_a_configured_share_is_whole_tokens_and_must_leave_the_pool_one_sequence() -> None:
    assert workspace_budget_bytes(100_000 * TOKEN, TOKEN, 16, 8192, configured=2500) == 2 * TOKEN
    assert workspace_budget_bytes(100_000 * TOKEN, TOKEN, 16, 8192, configured=0) == 0
    with pytest.raises(ConfigError, match="--workspace-size"):
        workspace_budget_bytes(100_000 * TOKEN, TOKEN, 16, 8192, configured=95_000 * TOKEN)
    with pytest.raises(ConfigError, match="workspace_bytes"):
        CacheConfig(workspace_bytes=-1)


def test_the_pool_gets_the_device_budget_less_the_workspaces() -> None:
    layout = PageLayout(2, 2, 8, 16, torch.bfloat16)
    cache = CacheConfig(device_cache_bytes=1 << 24)
    engine = EngineConfig(max_model_len=1024, max_num_seqs=4)
    carved, workspace = carve_workspace(cache, engine, layout, cpu_attention=True)
    assert workspace == 4 * 1024 * layout.token_bytes  # less than half the budget
    assert carved.device_cache_bytes + workspace == cache.device_cache_bytes
    assert carve_workspace(cache, engine, layout, cpu_attention=False) == (cache, 0)


def test_released_slots_keeping_no_pages_give_back_first_then_the_longest_released() -> None:
    budget = SlotBudget(slots=4, budget_tokens=250)
    for slot in range(4):
        budget.grow(slot, 100)
        budget.released(slot)
    assert budget.resident_tokens == 400 and budget.over_budget()
    assert budget.to_give_back(free=[0, 1, 2, 3], kept={0, 2}) == [1, 3]
    assert budget.to_give_back(free=[0, 2], kept={0, 2}) == [0, 2]
    budget.given_back(1)
    budget.given_back(3)
    assert budget.resident_tokens == 200 and not budget.over_budget()


def pool_with_kv() -> DevicePool:
    pool = DevicePool(PageLayout(3, 2, 8, 16, torch.float32), 80, "cpu")
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(3)))
    return pool


def written(arena: WorkspaceArena, pool: DevicePool, tokens: int) -> Workspace:
    """A slot holding `tokens` tokens' KV, as a finished prefill leaves it."""
    workspace = arena.take(tokens)
    assert workspace is not None and workspace.slot is not None
    pages = pool.alloc(-(-tokens // 16))
    workspace.fill_from_pool(pool, pages, tokens)
    workspace.mirrors.extend(pool, pages, -(-tokens // 16))
    arena.grow(workspace.slot, tokens)
    return workspace


def test_an_arena_past_its_budget_gives_released_memory_back_as_zeros() -> None:
    pool = pool_with_kv()
    arena = WorkspaceArena(pool, slots=3, capacity=256, budget_tokens=300)
    first, second = written(arena, pool, 200), written(arena, pool, 160)
    assert arena.resident_bytes == 360 * pool.layout.token_bytes  # both running: over budget
    arena.give(first)  # released while over budget: its memory goes back
    assert torch.count_nonzero(arena.kv[0]) == 0
    assert arena.resident_bytes == 160 * pool.layout.token_bytes
    arena.give(second)  # within budget: kept resident for the next turn
    assert torch.count_nonzero(arena.kv[1]) > 0
    again = arena.take(200, second.mirrors.pages.tolist(), 160)
    assert again is not None and again.slot == 1 and again.length == 160  # its history kept
    assert arena.reused_tokens == 160
