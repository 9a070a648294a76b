"""What the index hands back: a match (its pages per serving tier) and an insert's outcome, and
the opaque `PathEnd` that callers above the index hold a node as."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.tier import Tier


class PathEnd(Protocol):
    """A node a match or an insert ended at, as the layers above the index hold it: passed
    back to the cache (lock, unlock, insert's start, pins), never read."""


@dataclass(frozen=True)
class MatchSegment:
    """The consecutive matched nodes served by one tier and their page ids there."""

    tier: Tier
    nodes: tuple[RadixNode, ...] = ()
    pages: tuple[int, ...] = ()

    @property
    def num_pages(self) -> int:
        return len(self.pages)


@dataclass(frozen=True)
class MatchResult:
    """The longest cached prefix of a prompt: device pages, then host, disk, remote, then the miss.

    A snapshot: lock `last_node` to keep its pages (locked nodes are never evicted, demoted or
    merged); without a lock, use it before the next call that changes the cache.
    """

    namespace_key: bytes
    num_tokens: int  # the prompt's length
    page_size: int
    device: MatchSegment
    host: MatchSegment
    disk: MatchSegment
    remote: MatchSegment
    last_node: RadixNode | None  # deepest matched node; None when nothing matched

    @property
    def segments(self) -> tuple[MatchSegment, ...]:
        return (self.device, self.host, self.disk, self.remote)

    @property
    def num_pages(self) -> int:
        return sum(segment.num_pages for segment in self.segments)

    @property
    def matched_len(self) -> int:
        """Matched tokens: whole pages, at most `num_tokens - 1`."""
        return self.num_pages * self.page_size

    def tokens_by_tier(self) -> dict[Tier, int]:
        return {s.tier: s.num_pages * self.page_size for s in self.segments}


@dataclass(frozen=True)
class InsertResult:
    """The outcome of `TieredCache.insert`.

    `device_pages` are the tree's device pages for the first `num_pages` pages of the tokens:
    the caller's page table for them from now on. `duplicate_pages` are caller pages the tree
    did not take (another request computed those pages first): still the caller's; free them
    with `TieredCache.free` once nothing reads them. Caller pages past `num_pages` (the insert
    stopped at a node whose device copy is still in flight) also stay the caller's.
    """

    num_existing_pages: int  # leading pages the tree already had
    num_pages: int  # pages of the tokens now in the tree (existing + new)
    node: RadixNode | None  # the deepest node of those pages: move the request's lock here
    device_pages: tuple[int, ...]
    duplicate_pages: tuple[int, ...]
