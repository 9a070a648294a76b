"""Random sequences of cache operations against a reference model, with tiny tiers.

The reference is a dict from (namespace, token prefix) to the bytes inserted for the page that
ends that prefix. Transfers run on a manual executor; the machine completes or fails pending
tickets in any order. After every step: `check_integrity()` holds, locked paths kept every
copy they had, and every page a match or a promotion hands out holds the reference bytes.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests.support.page_view import PageView
from tests.support.tiny_cache import expected_pages, make_cache, tiny_layout
from tieredkv.cache.index.match_results import MatchResult
from tieredkv.cache.index.page_key import page_key
from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.token_run import PackedTokens
from tieredkv.cache.page_record import PageRecord
from tieredkv.cache.residency.promotion import PromotionTicket
from tieredkv.cache.retention import RETENTION_S
from tieredkv.cache.tier import Tier
from tieredkv.config import WritePolicy

PAGE_SIZE = 2
LAYOUT = tiny_layout(PAGE_SIZE)
# Prompts share prefixes often: a prefix of one of a few conversations, then a short tail.
CONVERSATIONS = ([1] * 8, [1, 1, 2, 2, 3, 3, 4, 4], [2, 1] * 4)
tokens_st = st.builds(
    lambda base, length, tail: base[:length] + tail,
    st.sampled_from(CONVERSATIONS),
    st.integers(0, 8),
    st.lists(st.integers(0, 3), max_size=2),
)
namespace_st = st.sampled_from(["a", "b"])


@dataclass
class Held:
    """A lock the machine holds, with the copies the locked path had when it was taken."""

    node: RadixNode
    namespace: str
    tokens: list[int]
    copies: list[dict[Tier, int]]  # per page of the path: tier -> page id
    promotion: PromotionTicket | None = None


@dataclass
class Running:
    """A request between computing its pages and inserting them."""

    namespace: str
    tokens: list[int]
    lock: RadixNode | None  # the end of the reused device segment
    page_table: list[int]  # reused tree pages, then its private pages
    private: list[int]


def _snapshot(node: RadixNode) -> list[dict[Tier, int]]:
    """Per page of the path to `node` (splits do not change it): its committed copies."""
    return [
        {tier: pages[i] for tier, pages in n.residence.copies.items()}
        for n in node.path()
        for i in range(n.num_pages)
    ]


class TieredCacheMachine(RuleBasedStateMachine):
    @initialize(
        device_pages=st.integers(5, 6),
        host_pages=st.sampled_from([0, 4, 8]),
        disk_pages=st.sampled_from([0, 6, 12]),
        policy=st.sampled_from(list(WritePolicy)),
        share=st.sampled_from([None, 0.25, 1.0]),  # fair shares: equal, fixed, off
    )
    def start(
        self,
        device_pages: int,
        host_pages: int,
        disk_pages: int,
        policy: WritePolicy,
        share: float | None,
    ):
        self.directory = Path(tempfile.mkdtemp(prefix="tkv-prop-"))
        self.sizes = (device_pages, host_pages, disk_pages, policy, share)
        self.corrupted: set[int] = set()  # disk slots overwritten on purpose
        self.reference: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
        self._open()

    def _open(self) -> None:
        device_pages, host_pages, disk_pages, policy, share = self.sizes
        self.page_view = PageView()  # what a consumer of the cache's page events believes
        self.cache, self.executor = make_cache(
            LAYOUT, device_pages, host_pages, disk_pages, self.directory, policy,
            namespace_share=share, page_listener=self.page_view, retention_pages=4,
        )  # fmt: skip
        self.held: list[Held] = []
        self.running: list[Running] = []
        # retained prefixes -> per page, the page id of its lowest local copy once seen
        self.retained: dict[tuple[str, tuple[int, ...]], list[int | None]] = {}
        self.now = 0.0
        if not hasattr(self, "inserted"):
            self.inserted: list[tuple[str, list[int]]] = []

    def teardown(self) -> None:
        if hasattr(self, "cache"):
            self.cache.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    # --- checks ----------------------------------------------------------------------------

    def _expect(self, namespace: str, tokens: list[int], index: int) -> torch.Tensor:
        prefix = tuple(tokens[: (index + 1) * PAGE_SIZE])
        return self.reference[namespace, prefix]

    def _read(self, tier: Tier, page: int, key: bytes | None) -> torch.Tensor | None:
        if tier is Tier.DEVICE:
            return self.cache.device_pool.kv[:, :, page]
        if tier is Tier.HOST:
            return self.cache.host_pool.kv[page]
        assert key is not None
        out = torch.empty((1, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
        disk = self.cache.pools.disk
        assert disk is not None
        if disk.read_pages([page], [key], out) == [True]:
            return out[0]
        assert page in self.corrupted, f"disk page {page} fails verification"
        return None  # corrupted on purpose: a promotion must not serve it

    def _keys(self, tier: Tier, node: RadixNode) -> list[bytes | None]:
        """A disk page is read with its key (a disk copy has them all); others need none."""
        if tier is Tier.DISK:
            assert len(node.keys) == node.num_pages, f"{node}: a disk copy without its keys"
            return list(node.keys)
        return [None] * node.num_pages

    def _check_match(self, match: MatchResult, namespace: str, tokens: list[int]) -> None:
        index = 0
        for segment in match.segments:
            pages = [
                (key, n.residence.copies[segment.tier][i])
                for n in segment.nodes
                for i, key in enumerate(self._keys(segment.tier, n))
            ]
            assert [page for _, page in pages] == list(segment.pages)
            for key, page in pages:
                want = self._expect(namespace, tokens, index)
                got = self._read(segment.tier, page, key)
                assert got is None or torch.equal(got, want), f"{segment.tier.label} {index}"
                index += 1
        assert index == match.num_pages

    @invariant()
    def integrity_holds(self) -> None:
        if hasattr(self, "cache"):
            result = self.cache.check_integrity()
            assert result.ok, result.problems

    @invariant()
    def page_events_tell_what_each_tier_holds(self) -> None:
        if hasattr(self, "cache"):
            assert self.page_view.matches(self.cache)

    @invariant()
    def locked_paths_keep_their_copies(self) -> None:
        for held in getattr(self, "held", []):
            assert held.node.attached
            now = _snapshot(held.node)
            corrupt = False  # a bad record drops its disk copy and the disk copies below it
            for index, (before, after) in enumerate(zip(held.copies, now, strict=True)):
                corrupt = corrupt or before.get(Tier.DISK) in self.corrupted
                for tier, page in before.items():
                    if tier is Tier.DISK and corrupt:
                        continue
                    assert after.get(tier) == page, f"locked page {index} lost {tier.label}"

    @invariant()
    def retained_prefixes_keep_their_lowest_copy(self) -> None:
        """Once a retained page has a copy in the lowest local tier, that copy stays (a corrupt
        disk record drops it, and the disk copies below it)."""
        lowest = Tier.DISK if self.cache.tier_enabled(Tier.DISK) else Tier.HOST
        for (namespace, tokens), seen in getattr(self, "retained", {}).items():
            prefix = self.cache.retention.get(namespace, tokens)
            assert prefix is not None
            now = [copies.get(lowest) for copies in _snapshot(prefix.node)]
            seen.extend([None] * (len(now) - len(seen)))
            corrupt = False
            for index, page in enumerate(now):
                corrupt = corrupt or (lowest is Tier.DISK and seen[index] in self.corrupted)
                if seen[index] is not None and not corrupt:
                    assert page == seen[index], f"retained page {index} lost its {lowest.label}"
                seen[index] = page

    # --- requests --------------------------------------------------------------------------

    @precondition(lambda self: len(self.running) < 2)
    @rule(namespace=namespace_st, tokens=tokens_st)
    def start_request(self, namespace: str, tokens: list[int]) -> None:
        """Reuse the device segment of the match, compute the rest into private pages."""
        match = self.cache.match(tokens, namespace)
        self._check_match(match, namespace, tokens)
        reused = list(match.device.pages)
        lock = match.device.nodes[-1] if reused else None
        if lock is not None:
            self.cache.lock(lock)
        pages = self.cache.allocate(len(tokens) // PAGE_SIZE - len(reused))
        if pages is None:
            if lock is not None:
                self.cache.unlock(lock)
            return
        expected = expected_pages(tokens, namespace, LAYOUT)
        for index, contents in enumerate(expected):
            self.reference[namespace, tuple(tokens[: (index + 1) * PAGE_SIZE])] = contents
        for page, contents in zip(pages, expected[len(reused) :], strict=True):
            self.cache.device_pool.kv[:, :, page] = contents
        self.running.append(Running(namespace, tokens, lock, reused + pages, pages))

    def _end_request(self, data: st.DataObject) -> Running:
        running = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        for index, page in enumerate(running.page_table):  # nobody touched its pages
            want = self._expect(running.namespace, running.tokens, index)
            assert torch.equal(self.cache.device_pool.kv[:, :, page], want)
        return running

    @precondition(lambda self: self.running)
    @rule(data=st.data(), keep_lock=st.booleans(), packed=st.booleans())
    def finish_request(self, data: st.DataObject, keep_lock: bool, packed: bool) -> None:
        run = self._end_request(data)
        tokens = PackedTokens.from_ids(run.tokens) if packed else run.tokens
        # as the engine's handle does: the walk starts at the matched node it holds locked
        # (after a flush advanced the namespace's generation, the root leads elsewhere)
        reused = len(run.page_table) - len(run.private)
        start = {"start_node": run.lock, "start_pages": reused} if run.lock is not None else {}
        result = self.cache.insert(tokens, run.namespace, run.page_table, **start)
        if result.num_pages and len(self.inserted) < 8:
            self.inserted.append((run.namespace, run.tokens[: result.num_pages * PAGE_SIZE]))
        assert result.device_pages[: len(run.page_table) - len(run.private)] == tuple(
            run.page_table[: min(result.num_pages, len(run.page_table) - len(run.private))]
        )
        mine = set(run.private) - set(result.device_pages)
        assert set(result.duplicate_pages) <= mine
        self.cache.free(sorted(mine))
        if keep_lock and result.node is not None and len(self.held) < 2:
            self.cache.lock(result.node)
            held_tokens = run.tokens[: result.num_pages * PAGE_SIZE]
            snapshot = _snapshot(result.node)
            self.held.append(Held(result.node, run.namespace, held_tokens, snapshot))
        if run.lock is not None:
            self.cache.unlock(run.lock)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def abort_request(self, data: st.DataObject) -> None:
        self._abort(self._end_request(data))

    def _abort(self, run: Running) -> None:
        self.cache.free(run.private)
        if run.lock is not None:
            self.cache.unlock(run.lock)

    @rule(namespace=namespace_st, tokens=tokens_st, promote=st.booleans(), flags=st.integers(0, 3))
    def match(self, namespace: str, tokens: list[int], promote: bool, flags: int) -> None:
        self._match(namespace, tokens, promote, prefetch=bool(flags & 1), packed=bool(flags & 2))

    @precondition(lambda self: self.inserted)
    @rule(data=st.data(), prefetch=st.booleans(), wait=st.booleans())
    def match_inserted(self, data: st.DataObject, prefetch: bool, wait: bool) -> None:
        """Match and promote a prompt that was inserted before (plus one token); maybe wait
        for every transfer, finished in a random order."""
        namespace, tokens = data.draw(st.sampled_from(self.inserted))
        self._match(namespace, [*tokens, 0], True, prefetch)
        if wait and self.executor.pending():
            for ticket in data.draw(st.permutations(self.executor.pending())):
                self.executor.complete(ticket)
            self._poll()

    def _match(
        self, namespace: str, tokens: list[int], promote: bool, prefetch: bool, packed: bool = False
    ) -> None:
        """`packed`: the query is PackedTokens, not ids (the results must not differ)."""
        match = self.cache.match(PackedTokens.from_ids(tokens) if packed else tokens, namespace)
        assert match.matched_len <= max(len(tokens) - 1, 0)
        assert match.matched_len % PAGE_SIZE == 0
        self._check_match(match, namespace, tokens)
        if match.last_node is None:
            return
        if prefetch:
            self.cache.prefetch(match, max_pages=2)
        if promote and len(self.held) < 3:
            self.cache.lock(match.last_node)
            held_tokens = tokens[: match.matched_len]
            held = Held(match.last_node, namespace, held_tokens, _snapshot(match.last_node))
            ticket = self.cache.promote(match)
            if ticket is None:
                self.cache.unlock(match.last_node)
                return
            held.promotion = ticket
            self.held.append(held)
            if ticket.done:
                self._check_promotion(ticket, namespace, tokens)

    def _check_promotion(self, ticket: PromotionTicket, namespace: str, tokens: list[int]) -> None:
        assert ticket.num_ready_pages <= ticket.match.num_pages
        assert sum(ticket.tokens_by_tier.values()) == ticket.ready_len
        for index, page in enumerate(ticket.device_pages):
            got = self.cache.device_pool.kv[:, :, page]
            assert torch.equal(got, self._expect(namespace, tokens, index))

    def _poll(self) -> None:
        for ticket in self.cache.poll():
            held = next(h for h in self.held if h.promotion is ticket)
            self._check_promotion(ticket, held.namespace, held.tokens)

    @precondition(lambda self: self.executor.pending())
    @rule(data=st.data(), failure=st.integers(0, 5))
    def finish_transfer(self, data: st.DataObject, failure: int) -> None:
        pending = self.executor.pending()
        ticket = pending[data.draw(st.integers(0, len(pending) - 1))]
        if failure:  # one in six fails
            self.executor.complete(ticket)
        else:
            self.executor.fail(ticket)
        self._poll()

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        held = self.held[data.draw(st.integers(0, len(self.held) - 1))]
        if held.promotion is not None and not held.promotion.done:
            return  # the request waits for its promotion first
        self.held.remove(held)
        self.cache.unlock(held.node)

    @precondition(lambda self: self.inserted)
    @rule(data=st.data(), expire=st.integers(0, 7))
    def retain_inserted(self, data: st.DataObject, expire: int) -> None:
        """Retain a prompt inserted before (a budget of 4 pages: older ones lose their
        guarantee), or rarely let every retention run out."""
        if expire == 0:
            self.now += RETENTION_S
            self.cache.retention.expire(self.now)
        else:
            namespace, tokens = data.draw(st.sampled_from(self.inserted))
            self.now += 1.0
            if self.cache.retention.retain(tokens, namespace, self.now):
                self.retained.setdefault((namespace, tuple(tokens)), [])
        self.retained = {
            (namespace, tokens): seen
            for (namespace, tokens), seen in self.retained.items()
            if self.cache.retention.get(namespace, tokens) is not None
        }

    @rule(tier=st.sampled_from(list(Tier)), num_pages=st.integers(1, 6), flush=st.integers(0, 15))
    def evict(self, tier: Tier, num_pages: int, flush: int) -> None:
        if flush == 0:  # rarely: drop everything that may go
            self.cache.flush()
        elif self.cache.tier_enabled(tier):
            self.cache.evict(tier, num_pages)

    @precondition(lambda self: self.executor.pending())
    @rule(data=st.data())
    def finish_all_transfers(self, data: st.DataObject) -> None:
        pending = data.draw(st.permutations(self.executor.pending()))
        for ticket in pending:
            self.executor.complete(ticket)
        self._poll()

    @rule(data=st.data())
    def corrupt_disk_record(self, data: st.DataObject) -> None:
        """Overwrite a disk record with a page of another chain: it must never be served."""
        disk = self.cache.pools.disk
        nodes = [n for n in self.cache.tree.iter_nodes() if Tier.DISK in n.residence.copies]
        if disk is None or not nodes:
            return
        node = data.draw(st.sampled_from(nodes))
        index = data.draw(st.integers(0, node.num_pages - 1))
        slot, tokens = node.residence.copies[Tier.DISK][index], node.page_ids(index, PAGE_SIZE)
        record = PageRecord(page_key(b"other chain" * 2, tokens), b"other chain" * 2, tokens)
        zeros = torch.zeros((1, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
        disk.write_pages([slot], [record], zeros)
        self.corrupted.add(slot)

    @rule(fail=st.booleans(), dice=st.integers(0, 9))
    def reopen(self, fail: bool, dice: int) -> None:
        """Rarely: finish (or fail) every transfer, end every request, restart on the disk."""
        if dice:
            return
        for ticket in self.executor.pending():
            self.executor.fail(ticket) if fail else self.executor.complete(ticket)
        self._poll()
        for held in self.held:
            self.cache.unlock(held.node)
        for run in self.running:
            self._abort(run)
        self.cache.close()
        self._open()


TieredCacheMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_tiered_cache_machine = TieredCacheMachine.TestCase


@pytest.mark.slow
class TestTieredCacheMachineLong(TieredCacheMachine.TestCase):  # type: ignore[misc,valid-type]
    settings = settings(
        max_examples=500,
        stateful_step_count=150,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
