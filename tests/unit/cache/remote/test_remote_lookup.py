"""`remote_keys_past`: the keys it asks the store for are the prompt's own page keys past the
local match, chained on from it, never the page of the prompt's last token, at most
REMOTE_LOOKUP_MAX_PAGES; it returns the leading ones the store holds."""

from __future__ import annotations

from collections.abc import Sequence

from tests.support.tiny_cache import FINGERPRINT, make_cache, tiny_layout
from tests.unit.cache.cache_steps import compute
from tieredkv.cache.index.page_key import chain_keys, namespace_root_key
from tieredkv.cache.index.token_run import packed_bytes
from tieredkv.cache.remote.lookup import REMOTE_LOOKUP_MAX_PAGES, remote_keys_past
from tieredkv.cache.remote.remote_tier import RemoteTier

LAYOUT = tiny_layout()  # 4 tokens a page
NAMESPACE = "tenant"


class HoldingStore:
    """A store that holds the first `held` keys it is asked about; records each question."""

    def __init__(self, held: int) -> None:
        self.held = held
        self.asked: list[list[bytes]] = []

    def lookup(self, keys: Sequence[bytes]) -> int:
        self.asked.append(list(keys))
        return min(self.held, len(keys))


def page_keys(tokens: list[int]) -> list[bytes]:
    return chain_keys(namespace_root_key(FINGERPRINT, NAMESPACE), tokens, LAYOUT.page_size)


def look_up(tokens: list[int], computed: int, held: int) -> tuple[list[bytes], HoldingStore]:
    cache, _ = make_cache(LAYOUT, device_pages=64)
    if computed:
        compute(cache, tokens[:computed], NAMESPACE)
    store = HoldingStore(held)
    remote = RemoteTier(store, LAYOUT)  # type: ignore[arg-type]
    match = cache.match(tokens, NAMESPACE)
    keys, gaps = remote_keys_past(remote, cache.tree, match, packed_bytes(tokens))
    assert gaps == frozenset()  # a page without sliding layers is whole
    cache.close()
    return keys, store


def test_the_keys_past_the_match_chain_on_from_its_last_page() -> None:
    tokens = list(range(100, 121))  # 21 tokens: 5 full pages, the 6th holds the last token
    keys, store = look_up(tokens, computed=8, held=10)
    assert store.asked == [page_keys(tokens)[2:5]]  # pages 3..5; 1..2 matched on the device
    assert keys == page_keys(tokens)[2:5]


def test_without_a_match_the_keys_chain_from_the_namespace_root() -> None:
    tokens = list(range(100, 117))  # 17 tokens: 4 full pages, all usable
    keys, store = look_up(tokens, computed=0, held=2)
    assert store.asked == [page_keys(tokens)]
    assert keys == page_keys(tokens)[:2]  # the leading ones the store holds


def test_the_page_of_the_last_token_is_never_asked_for() -> None:
    tokens = list(range(100, 116))  # 16 tokens: the 4th page holds the last token
    keys, store = look_up(tokens, computed=12, held=10)
    assert keys == [] and store.asked == []  # pages 1..3 matched: nothing left to ask for


def test_one_question_asks_for_at_most_the_limit() -> None:
    tokens = list(range((REMOTE_LOOKUP_MAX_PAGES + 3) * LAYOUT.page_size + 1))
    keys, store = look_up(tokens, computed=0, held=REMOTE_LOOKUP_MAX_PAGES + 3)
    assert store.asked == [page_keys(tokens)[:REMOTE_LOOKUP_MAX_PAGES]]
    assert len(keys) == REMOTE_LOOKUP_MAX_PAGES
