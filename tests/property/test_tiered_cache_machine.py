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

from tieredkv.cache.cache_results import MatchResult, PromotionTicket
from tieredkv.cache.radix_tree import RadixNode
from tieredkv.cache.testing import expected_pages, make_cache, tiny_layout
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


def _snapshot(node: RadixNode) -> list[dict[Tier, int]]:
    """Per page of the path to `node` (splits do not change it): its committed copies."""
    return [
        {tier: pages[i] for tier, pages in n.copies.items()}
        for n in node.path()
        for i in range(n.num_pages)
    ]


class TieredCacheMachine(RuleBasedStateMachine):
    @initialize(
        device_pages=st.integers(5, 6),
        host_pages=st.sampled_from([0, 4, 8]),
        disk_pages=st.sampled_from([0, 6, 12]),
        policy=st.sampled_from(list(WritePolicy)),
    )
    def start(self, device_pages: int, host_pages: int, disk_pages: int, policy: WritePolicy):
        self.directory = Path(tempfile.mkdtemp(prefix="tkv-prop-"))
        self.sizes = (device_pages, host_pages, disk_pages, policy)
        self.reference: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
        self._open()

    def _open(self) -> None:
        device_pages, host_pages, disk_pages, policy = self.sizes
        self.cache, self.executor = make_cache(
            LAYOUT, device_pages, host_pages, disk_pages, self.directory, policy
        )
        self.held: list[Held] = []

    def teardown(self) -> None:
        if hasattr(self, "cache"):
            self.cache.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    # --- checks ----------------------------------------------------------------------------

    def _expect(self, namespace: str, tokens: list[int], index: int) -> torch.Tensor:
        prefix = tuple(tokens[: (index + 1) * PAGE_SIZE])
        return self.reference[namespace, prefix]

    def _read(self, tier: Tier, page: int, key: bytes) -> torch.Tensor:
        if tier is Tier.DEVICE:
            return self.cache.device_pool.kv[:, :, page]
        if tier is Tier.HOST:
            return self.cache.host_pool.kv[page]
        out = torch.empty((1, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
        disk = self.cache.pools.disk
        assert disk is not None
        assert disk.read_pages([page], [key], out) == [True]
        return out[0]

    def _check_match(self, match: MatchResult, namespace: str, tokens: list[int]) -> None:
        index = 0
        for segment in match.segments:
            pages = [
                (n.keys[i], n.copies[segment.tier][i])
                for n in segment.nodes
                for i in range(n.num_pages)
            ]
            assert [page for _, page in pages] == list(segment.pages)
            for key, page in pages:
                want = self._expect(namespace, tokens, index)
                got = self._read(segment.tier, page, key)
                assert torch.equal(got, want), f"{segment.tier.label} page {index} differs"
                index += 1
        assert index == match.num_pages

    @invariant()
    def integrity_holds(self) -> None:
        if hasattr(self, "cache"):
            result = self.cache.check_integrity()
            assert result.ok, result.problems

    @invariant()
    def locked_paths_keep_their_copies(self) -> None:
        for held in getattr(self, "held", []):
            assert held.node.attached
            now = _snapshot(held.node)
            for index, (before, after) in enumerate(zip(held.copies, now, strict=True)):
                for tier, page in before.items():
                    assert after.get(tier) == page, f"locked page {index} lost {tier.label}"

    # --- requests --------------------------------------------------------------------------

    @rule(namespace=namespace_st, tokens=tokens_st, keep_lock=st.booleans())
    def compute_and_insert(self, namespace: str, tokens: list[int], keep_lock: bool) -> None:
        """A request: reuse the device segment of its match, compute the rest, insert it."""
        match = self.cache.match(tokens, namespace)
        self._check_match(match, namespace, tokens)
        reused = list(match.device.pages)
        if reused:
            self.cache.lock(match.device.nodes[-1])
        num_pages = len(tokens) // PAGE_SIZE
        pages = self.cache.allocate(num_pages - len(reused))
        if pages is not None:
            expected = expected_pages(tokens, namespace, LAYOUT)
            for index, contents in enumerate(expected):
                self.reference[namespace, tuple(tokens[: (index + 1) * PAGE_SIZE])] = contents
            for page, contents in zip(pages, expected[len(reused) :], strict=True):
                self.cache.device_pool.kv[:, :, page] = contents
            result = self.cache.insert(tokens, namespace, reused + pages)
            assert result.device_pages[: len(reused)] == tuple(reused[: result.num_pages])
            mine = set(pages) - set(result.device_pages)
            assert set(result.duplicate_pages) <= mine
            self.cache.free(sorted(mine))
            if keep_lock and result.node is not None and len(self.held) < 2:
                self.cache.lock(result.node)
                held_tokens = tokens[: result.num_pages * PAGE_SIZE]
                snapshot = _snapshot(result.node)
                self.held.append(Held(result.node, namespace, held_tokens, snapshot))
        if reused:
            self.cache.unlock(match.device.nodes[-1])

    @rule(namespace=namespace_st, tokens=tokens_st, promote=st.booleans(), prefetch=st.booleans())
    def match(self, namespace: str, tokens: list[int], promote: bool, prefetch: bool) -> None:
        match = self.cache.match(tokens, namespace)
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

    @rule(fail=st.booleans())
    def reopen(self, fail: bool) -> None:
        """Finish (or fail) every transfer, end every request, restart on the same disk."""
        for ticket in self.executor.pending():
            self.executor.fail(ticket) if fail else self.executor.complete(ticket)
        self._poll()
        for held in self.held:
            self.cache.unlock(held.node)
        self.cache.close()
        self._open()


TieredCacheMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_tiered_cache_machine = TieredCacheMachine.TestCase


@pytest.mark.slow
class TestTieredCacheMachineLong(TieredCacheMachine.TestCase):  # type: ignore[misc,valid-type]
    settings = settings(
        max_examples=400,
        stateful_step_count=80,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
