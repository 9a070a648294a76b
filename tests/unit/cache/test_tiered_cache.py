import errno
from pathlib import Path

import pytest
import torch

from tests.support.manual_executor import ManualTransferExecutor
from tests.support.tiny_cache import (
    FINGERPRINT,
    device_page,
    expected_pages,
    make_cache,
    tiny_layout,
)
from tests.unit.cache.cache_steps import compute, ok, settle
from tieredkv.cache.build import build_cache
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.index.page_key import page_key
from tieredkv.cache.page_record import PageRecord
from tieredkv.cache.residency.residence import Presence
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import CacheConfig, WritePolicy

LAYOUT = tiny_layout(page_size=4)


def assert_promoted(cache: TieredCache, tokens: list[int], namespace: str = "default") -> None:
    """Match, promote, run the copies; every ready page holds the inserted bytes."""
    match = cache.match(tokens, namespace)
    ticket = cache.promote(match)
    assert ticket is not None
    ok(cache)
    executor = cache.transfer_queue.memory_executor
    assert isinstance(executor, ManualTransferExecutor)
    settle(cache, executor)
    assert ticket.done and ticket.num_ready_pages == match.num_pages
    for page, want in zip(
        ticket.device_pages, expected_pages(tokens, namespace, LAYOUT), strict=False
    ):
        assert torch.equal(device_page(cache, page), want)


def test_match_reuses_at_most_len_minus_one_floored_to_pages() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)
    tokens = list(range(12))
    compute(cache, tokens)
    assert cache.match(tokens).matched_len == 8  # 11 tokens may be reused -> 2 pages
    assert cache.match([*tokens, 5]).matched_len == 12
    assert cache.match(tokens[:5] + [99] * 8).matched_len == 4  # diverges in page 2
    assert cache.match([1]).matched_len == 0
    ok(cache)


def test_namespaces_are_isolated() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)
    tokens = list(range(9))
    compute(cache, tokens, "alice")
    assert cache.match(tokens, "alice").matched_len == 8
    assert cache.match(tokens, "bob").matched_len == 0
    assert cache.match(tokens).matched_len == 0


def test_insert_reports_existing_pages_and_duplicates() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)
    tokens = list(range(12))
    compute(cache, tokens[:8])
    pages = cache.allocate(3)
    assert pages is not None
    result = cache.insert(tokens, "default", pages)
    assert result.num_existing_pages == 2 and result.num_pages == 3
    assert result.duplicate_pages == tuple(pages[:2])
    assert result.device_pages[2] == pages[2] and result.node is not None
    cache.free(list(result.duplicate_pages))
    ok(cache)


def test_eviction_demotes_to_host_then_promotion_brings_bytes_back() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=4)
    first, second = list(range(9)), list(range(100, 109))
    compute(cache, first)
    compute(cache, second)
    assert cache.allocate(4) is None  # demotions started; pages free once applied
    assert cache.match(first).device.num_pages == 2  # a node being demoted hits its source
    settle(cache, executor)
    assert cache.counters.evicted_pages[Tier.DEVICE, "demoted"] == 4
    assert cache.counters.transfer_bytes[Tier.DEVICE, Tier.HOST] == 4 * LAYOUT.page_bytes
    pages = cache.allocate(4)
    assert pages is not None
    cache.free(pages)
    match = cache.match(first)
    assert match.host.num_pages == 2 and match.device.num_pages == 0
    assert_promoted(cache, first)
    assert cache.counters.hit_tokens[Tier.HOST] == 8
    # the promoted page keeps its clean host copy: evicting it again costs no copy
    before = cache.counters.transfer_bytes[Tier.DEVICE, Tier.HOST]
    assert cache.evict(Tier.DEVICE, 4)
    assert cache.counters.transfer_bytes[Tier.DEVICE, Tier.HOST] == before
    ok(cache)


def test_presence_says_what_is_present_arriving_and_leaving() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=4)
    first, second = list(range(9)), list(range(100, 109))
    compute(cache, first)
    compute(cache, second)
    node = cache.match(first).last_node
    assert node is not None
    assert node.residence.presence() == {Tier.DEVICE: Presence.PRESENT}
    assert cache.allocate(4) is None  # both demotions start
    assert node.residence.presence() == {
        Tier.DEVICE: Presence.LEAVING,
        Tier.HOST: Presence.ARRIVING,
    }
    settle(cache, executor)
    assert node.residence.presence() == {Tier.HOST: Presence.PRESENT}
    assert_promoted(cache, first)  # a promotion copies: the host copy stays
    assert node.residence.presence() == {
        Tier.DEVICE: Presence.PRESENT,
        Tier.HOST: Presence.PRESENT,
    }
    ok(cache)


def test_locked_path_is_never_evicted() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=4, host_pages=4)
    tokens = list(range(17))
    compute(cache, tokens)
    match = cache.match(tokens)
    cache.lock(match.last_node)
    assert not cache.evict(Tier.DEVICE, 1)
    assert cache.allocate(1) is None and cache.transfer_queue.in_flight == {}
    cache.unlock(match.last_node)
    assert cache.allocate(1) is None  # now it demotes
    assert cache.transfer_queue.in_flight
    ok(cache)


def test_two_promotions_share_one_transfer() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=4)
    tokens = list(range(9))
    compute(cache, tokens)
    assert not cache.allocate(4)
    settle(cache, executor)
    assert cache.match(tokens).host.num_pages == 2
    one = cache.promote(cache.match(tokens))
    two = cache.promote(cache.match([*tokens, 1]))
    assert one is not None and two is not None
    assert len(executor.pending()) == 1 and one.transfers == two.transfers
    settle(cache, executor)
    assert one.done and two.done and one.device_pages == two.device_pages


def test_write_through_makes_eviction_free() -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=4, host_pages=4, write_policy=WritePolicy.WRITE_THROUGH
    )
    tokens = list(range(17))
    compute(cache, tokens)
    assert [t.dst_tier for t in executor.pending()] == [Tier.HOST]
    settle(cache, executor)
    assert cache.allocate(4) is not None  # every device page had a clean host copy
    assert cache.counters.evicted_pages[Tier.DEVICE, "demoted"] == 4
    assert cache.match(tokens).host.num_pages == 4


def test_failed_disk_read_shortens_the_match(tmp_path: Path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=4, host_pages=0, disk_pages=8, disk_dir=tmp_path
    )
    tokens = list(range(17))
    compute(cache, tokens)
    assert cache.allocate(4) is None
    settle(cache, executor)
    pages = cache.allocate(4)
    assert pages is not None
    cache.free(pages)
    match = cache.match(tokens)
    assert match.disk.num_pages == 4
    (node,) = match.disk.nodes
    # overwrite page 2's record with a page of another chain: it fails verification
    disk = cache.pools.disk
    assert disk is not None
    other, bad_tokens = b"x" * 16, node.page_ids(2, 4)
    zeros = torch.zeros((1, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
    record = PageRecord(page_key(other, bad_tokens), other, bad_tokens)
    disk.write_pages([node.residence.copies[Tier.DISK][2]], [record], zeros)
    ticket = cache.promote(match)
    assert ticket is not None
    settle(cache, executor)
    assert ticket.done and ticket.num_ready_pages == 2  # the pages before the bad one
    assert cache.disk_page_errors()[DiskErrorReason.CHECKSUM] == 1
    assert cache.match(tokens).matched_len == 8  # the bad page and the rest are a miss
    assert cache.tier_used_bytes(Tier.DISK) == 2 * LAYOUT.page_bytes  # never served, freed
    for page, want in zip(
        ticket.device_pages, expected_pages(tokens, "default", LAYOUT), strict=False
    ):
        assert torch.equal(device_page(cache, page), want)


def test_failed_transfer_is_a_miss_not_an_error() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=4)
    tokens = list(range(17))
    compute(cache, tokens)
    cache.allocate(4)
    settle(cache, executor)
    match = cache.match(tokens)
    assert match.host.num_pages == 4
    ticket = cache.promote(match)
    assert ticket is not None
    executor.fail(executor.pending()[0], OSError(errno.EIO, "boom"))
    assert cache.poll() == [ticket]
    assert ticket.done and ticket.num_ready_pages == 0
    ok(cache)
    assert cache.match(tokens).host.num_pages == 4  # the source copy is untouched
    assert_promoted(cache, tokens)


@pytest.mark.parametrize("policy", list(WritePolicy))
def test_counters_and_used_bytes(policy: WritePolicy) -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=2, write_policy=policy)
    compute(cache, list(range(9)))
    assert cache.tier_used_bytes(Tier.DEVICE) == 2 * LAYOUT.page_bytes
    assert cache.tier_capacity_bytes(Tier.HOST) == 2 * LAYOUT.page_bytes
    assert cache.tier_capacity_bytes(Tier.DISK) == 0
    settle(cache, executor)
    assert cache.disk_page_errors() == dict.fromkeys(DiskErrorReason, 0)


def test_device_only_cache_drops_and_forgets() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=2)
    first, second = list(range(9)), list(range(100, 109))
    compute(cache, first)
    compute(cache, second)  # no lower tier: the first one is dropped, not demoted
    assert not executor.pending()
    assert cache.counters.evicted_pages[Tier.DEVICE, "dropped"] == 2
    assert cache.match(first).matched_len == 0 and cache.tree.num_nodes == 1
    assert cache.match(second).device.num_pages == 2


def test_no_cache_reuses_nothing() -> None:
    config = CacheConfig(
        page_size=4, device_cache_bytes=4 * LAYOUT.page_bytes, enable_prefix_reuse=False
    )
    cache = build_cache(config, LAYOUT, FINGERPRINT, memory_executor=ManualTransferExecutor())
    tokens = list(range(9))
    pages = cache.allocate(2)
    assert pages is not None
    result = cache.insert(tokens, "default", pages)
    assert result.num_pages == 0 and result.node is None
    assert cache.match(tokens).matched_len == 0
    cache.free(pages)  # the pages stayed the request's
    ok(cache)


def test_promote_can_hand_the_caller_a_lock_on_the_ready_pages() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=4)
    tokens = list(range(17))
    compute(cache, tokens)
    cache.allocate(4)
    settle(cache, executor)
    ticket = cache.promote(cache.match(tokens), hold_lock=True)
    assert ticket is not None and ticket.ready_node is None
    settle(cache, executor)
    assert ticket.done and ticket.ready_node is not None
    assert cache.index.lock_holders[ticket.ready_node] == 1  # the match's own lock is gone
    assert not cache.evict(Tier.DEVICE, 4)  # the caller's lock keeps the ready pages
    cache.unlock(ticket.ready_node)
    assert cache.evict(Tier.DEVICE, 4)
    ok(cache)


class RefusingAfterShutdown(ManualTransferExecutor):
    """A manual executor that, like a thread pool, refuses work once it was shut down."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def submit(self, ticket, job, report) -> None:
        if self.closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        super().submit(ticket, job, report)

    def shutdown(self) -> None:
        self.closed = True


def test_close_applies_finished_copies_without_starting_write_through(tmp_path: Path) -> None:
    """A copy that finished just before shutdown is applied at close; under write-through its
    commit would start the next copy down, on executors already shut down."""
    executor = RefusingAfterShutdown()
    cache, _ = make_cache(
        LAYOUT, device_pages=4, host_pages=4, disk_pages=8, disk_dir=tmp_path,
        write_policy=WritePolicy.WRITE_THROUGH, executor=executor,
    )  # fmt: skip
    tokens = list(range(17))
    compute(cache, tokens)
    assert [t.dst_tier for t in executor.pending()] == [Tier.HOST]
    executor.complete_all()  # finished, not yet applied
    cache.close()
    assert Tier.HOST in cache.match(tokens).last_node.residence.copies  # applied
    assert not executor.pending()  # and nothing new started
