"""KV events from a real tiered cache through a real publisher and real ZMQ sockets, decoded with
vLLM's schema: a page followed through every tier, replay, namespaces, drops."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from tests.support.tiny_cache import FINGERPRINT, make_cache, tiny_layout
from tests.unit.cache.cache_steps import compute, ok, settle
from tests.unit.kv_events.vllm_schema import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ConsumerView,
    Subscriber,
)
from tieredkv.cache.index.page_key import chain_keys, namespace_root_key
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import KvEventsConfig
from tieredkv.kv_events.publisher import KvEventPublisher
from tieredkv.kv_events.schema import MEDIUM_OF_TIER, block_hash

LAYOUT = tiny_layout(page_size=4)


@pytest.fixture
def endpoints(tmp_path: Path) -> KvEventsConfig:
    return KvEventsConfig(
        f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/replay", topic="kv", flush_interval_s=0.005
    )


@pytest.fixture
def publisher(endpoints: KvEventsConfig) -> Iterator[KvEventPublisher]:
    publisher = KvEventPublisher(endpoints, LAYOUT.page_size)
    yield publisher
    publisher.close()


@pytest.fixture
def subscriber(endpoints: KvEventsConfig) -> Iterator[Subscriber]:
    subscriber = Subscriber(endpoints.endpoint, endpoints.replay_endpoint, b"kv")
    yield subscriber
    subscriber.close()


def hashes(tokens: list[int], namespace: str = "default") -> list[int]:
    root = namespace_root_key(FINGERPRINT, namespace)
    return [block_hash(key) for key in chain_keys(root, tokens, LAYOUT.page_size)]


def cache_view(cache: TieredCache) -> dict[str, set[int]]:
    """What the cache holds per local tier, as block hashes per medium."""
    held: dict[str, set[int]] = {}
    for node in cache.tree.iter_nodes():
        for tier in node.residence.copies:
            if tier is not Tier.REMOTE:
                keys = cache.tree.page_keys(node)
                held.setdefault(MEDIUM_OF_TIER[tier], set()).update(map(block_hash, keys))
    return held


def make_room(cache: TieredCache, num_pages: int) -> None:
    """Demote until `num_pages` device pages are free, applying every copy."""
    executor = cache.transfer_queue.memory_executor
    while (pages := cache.allocate(num_pages)) is None:
        settle(cache, executor)  # type: ignore[arg-type]
    cache.free(pages)
    settle(cache, executor)  # type: ignore[arg-type]


def journey(events: list, page_hashes: list[int]) -> list[tuple[str, str | None]]:
    """The (event, medium) of every event naming one of `page_hashes`, in order."""
    wanted = set(page_hashes)
    return [
        (type(event).__name__, getattr(event, "medium", None))
        for event in events
        if isinstance(event, AllBlocksCleared) or wanted & set(event.block_hashes)
    ]


def test_a_page_is_followed_through_every_tier_and_the_flush(
    tmp_path: Path, publisher: KvEventPublisher, subscriber: Subscriber
) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=2, host_pages=2, disk_pages=8, disk_dir=tmp_path,
        page_listener=publisher,
    )  # fmt: skip
    view = ConsumerView()
    first, second, third = list(range(9)), list(range(100, 109)), list(range(200, 209))
    compute(cache, first)
    view.apply(subscriber.read_events())
    stored = next(e for e in subscriber.events() if isinstance(e, BlockStored))
    assert stored.block_hashes == hashes(first) and stored.parent_block_hash is None
    assert stored.token_ids == first[:8] and stored.block_size == 4 and stored.medium == "GPU"
    assert view.held() == cache_view(cache)

    make_room(cache, 2)  # first: device -> host
    compute(cache, second)
    make_room(cache, 2)  # second: device -> host; first: host -> disk
    compute(cache, third)
    view.apply(subscriber.read_events())
    assert view.held() == cache_view(cache)
    assert set(hashes(first)) <= view.held()["STORAGE"]

    match = cache.match([*first, 999])
    ticket = cache.promote(match)
    while ticket is None:
        settle(cache, executor)
        ticket = cache.promote(match)
    settle(cache, executor)
    assert ticket.done and ticket.num_ready_pages == 2
    view.apply(subscriber.read_events())
    assert view.held() == cache_view(cache)
    assert set(hashes(first)) <= view.held()["GPU"]

    cache.flush()
    ok(cache)
    view.apply(subscriber.read_events())
    assert view.held() == cache_view(cache) == {}
    trip = journey(subscriber.events(), hashes(first))
    assert trip[0] == ("AllBlocksCleared", None)  # the cache starts empty
    assert trip[1:6] == [
        ("BlockStored", "GPU"),
        ("BlockStored", "CPU"),
        ("BlockRemoved", "GPU"),
        ("BlockStored", "STORAGE"),
        ("BlockRemoved", "CPU"),
    ]
    assert ("BlockStored", "GPU") in trip[6:]
    assert trip[-1] == ("AllBlocksCleared", None)


def test_namespaces_never_share_a_hash_and_publish_no_name(
    publisher: KvEventPublisher, subscriber: Subscriber
) -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8, page_listener=publisher)
    tokens = list(range(9))
    compute(cache, tokens, "tenant-alpha")
    compute(cache, tokens, "tenant-beta")
    subscriber.read_until_quiet()
    stored = [e for e in subscriber.events() if isinstance(e, BlockStored)]
    assert [e.block_hashes for e in stored] == [
        hashes(tokens, "tenant-alpha"),
        hashes(tokens, "tenant-beta"),
    ]
    assert not set(stored[0].block_hashes) & set(stored[1].block_hashes)
    assert all(e.extra_keys is None and e.lora_name is None for e in stored)
    payloads = b"".join(payload for _, _, payload in subscriber.messages)
    assert b"tenant" not in payloads


def test_flushing_a_namespace_removes_exactly_its_pages(
    publisher: KvEventPublisher, subscriber: Subscriber
) -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8, page_listener=publisher)
    compute(cache, list(range(9)), "a")
    compute(cache, list(range(9)), "b")
    assert cache.flush(lambda name: name == "a") == 2
    subscriber.read_until_quiet()
    events = subscriber.events()
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert [sorted(e.block_hashes) for e in removed] == [sorted(hashes(list(range(9)), "a"))]
    cleared = [i for i, e in enumerate(events) if isinstance(e, AllBlocksCleared)]
    assert cleared == [0]  # at start only: namespace b keeps its pages


def test_replay_answers_from_a_sequence_number(
    endpoints: KvEventsConfig, publisher: KvEventPublisher, subscriber: Subscriber
) -> None:
    cache, _ = make_cache(LAYOUT, device_pages=16, page_listener=publisher)
    for start in range(0, 400, 100):
        compute(cache, list(range(start, start + 9)))
        subscriber.read_until_quiet(quiet_ms=200)  # one batch each: they went out apart
    live = subscriber.messages
    assert len(live) >= 2
    replayed = subscriber.replay(1)
    assert replayed == live[1:]
    assert all(topic == b"kv" for topic, _, _ in replayed)
    assert subscriber.replay(len(live)) == []


def test_a_subscriber_that_never_reads_does_not_block_the_engine(tmp_path: Path) -> None:
    config = KvEventsConfig(f"ipc://{tmp_path}/slow", max_queue_events=64, hwm=1)
    publisher = KvEventPublisher(config, LAYOUT.page_size)
    idle = Subscriber(config.endpoint, None)  # connected, never reads
    try:
        appended = 20_000
        for i in range(appended):  # as the engine thread would, far faster than a flush
            publisher.pages_stored(Tier.DEVICE, (i.to_bytes(16, "big"),), None, bytes(16))
        assert publisher.dropped > 0
    finally:
        publisher.close()
        idle.close()
    assert publisher.published + publisher.dropped == appended


def test_no_listener_publishes_nothing_and_events_are_msgpack(
    publisher: KvEventPublisher, subscriber: Subscriber
) -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)  # no listener: the cache reports to no one
    compute(cache, list(range(9)))
    assert cache.residency.events is None
    publisher.all_cleared()
    subscriber.read_until_quiet()
    [(topic, seq, payload)] = subscriber.messages
    assert (topic, seq) == (b"kv", 0)
    ts, events, rank = msgspec.msgpack.decode(payload)  # [ts, events, data_parallel_rank]
    assert events == [{"type": "AllBlocksCleared"}] and rank == 0 and ts > 0
