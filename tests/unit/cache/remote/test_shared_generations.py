"""Flush generations shared through a real Redis: a flush on one replica advances the shared
generation past everyone's, another replica adopts it at its next read, two flushes at once end
past each other, and a flush made while Redis was down is shared once it is back."""

from __future__ import annotations

from tieredkv.cache.flush_generations import FlushGenerations, scope_digest
from tieredkv.cache.remote.shared_generations import HASH_KEY, SharedGenerations
from tieredkv.tenants import tenant_namespace

ALICE = tenant_namespace("alice", "salt")
BOB = tenant_namespace("bob")


def replica(store) -> tuple[FlushGenerations, SharedGenerations]:
    generations = FlushGenerations()
    shared = SharedGenerations(store, generations, poll_s=3600.0)  # read by hand here
    shared.read()
    return generations, shared


def test_a_flush_reaches_the_other_replica_at_its_next_read(redis_server, open_store) -> None:
    first, first_shared = replica(open_store(redis_server.url))
    second, second_shared = replica(open_store(redis_server.url))
    assert first.advance("alice") == 1
    assert second.of(ALICE) == (0, 0)  # until it reads
    second_shared.read()
    assert second.of(ALICE) == (0, 1) and second.of(BOB) == (0, 0)
    assert second.advance(None) == 1 and first.advance(None) == 2  # at once: past each other
    first_shared.read()
    second_shared.read()
    assert first.of(BOB) == second.of(BOB) == (2, 0)
    with redis_server.client() as client:
        stored = client.hgetall(HASH_KEY)
    assert {key.decode() for key in stored} == {scope_digest(None), scope_digest("alice")}


def test_a_flush_the_store_missed_is_shared_when_it_is_back(redis_server, open_store) -> None:
    store = open_store(redis_server.url)
    first, first_shared = replica(store)
    second, second_shared = replica(open_store(redis_server.url))
    redis_server.kill()
    assert first.advance("alice") == 1  # this replica forgets at once; Redis did not hear
    redis_server.start()
    assert store.wait_healthy(10.0)
    first_shared.read()  # shares what the store missed
    second_shared.read()
    assert second.of(ALICE) == (0, 1)
