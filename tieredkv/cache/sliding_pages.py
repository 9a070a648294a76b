"""Which pages of a sliding-window layer the tiered tree needs, and what that rule saves.

A layer with window W: the query at position p reads keys p - W + 1 .. p. A request that reuses
a cached prefix of b tokens computes positions b, b + 1, ... itself, so the cache must give its
sliding layers only the keys b - W + 1 .. b - 1. Full layers need every key before b.

Reuse points are the ends of the radix tree's nodes: where a cached path ends (a finished or
preempted sequence's tokens) or branches (two sequences that share a prefix). The rule:

  the sliding part of a path's page i (tokens i * ps .. (i + 1) * ps - 1) is kept iff the page
  overlaps e - W + 1 .. e - 1 for some reuse point e at or after it on the path

  a match of m tokens is reused up to the longest page boundary b <= m whose window pages
  (`window_pages(b)`) all kept their sliding part; the request computes the rest. A match that
  ends at a reuse point loses nothing; one that ends inside a node goes back at most to the
  previous reuse point, where the rule kept the window.

Pages whose sliding part no reuse point needs are read by no continuation: the tiers need not
write that part down nor hold it. `LayerKinds` splits a page's bytes by layer kind,
`tokens_by_layer_kind` counts the tokens of each kind a tier holds, and `history_tokens` turns
the rule into the tokens of history a tier of a given size holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.tier import Tier
from tieredkv.model_config import ModelConfig


@dataclass(frozen=True)
class LayerKinds:
    """How a token's KV bytes split between full-attention and sliding-window layers."""

    full_layers: int
    sliding_layers: int
    window: int | None  # the longest sliding window (None: no sliding layer)
    layer_token_bytes: int  # one layer's K and V of one token

    def __post_init__(self) -> None:
        assert (self.window is None) == (self.sliding_layers == 0), (
            f"window {self.window} with {self.sliding_layers} sliding layers"
        )

    @classmethod
    def of(cls, model: ModelConfig, layout: PageLayout) -> LayerKinds:
        windows = [model.window_of(layer) for layer in range(model.num_layers)]
        sliding = [window for window in windows if window is not None]
        return cls(
            full_layers=len(windows) - len(sliding),
            sliding_layers=len(sliding),
            window=max(sliding, default=None),
            layer_token_bytes=layout.token_bytes // layout.num_layers,
        )

    @property
    def full_token_bytes(self) -> int:
        return self.full_layers * self.layer_token_bytes

    @property
    def sliding_token_bytes(self) -> int:
        return self.sliding_layers * self.layer_token_bytes

    def describe(self) -> dict:
        """For /health: the layers of each kind, their window and bytes a token."""
        return {
            "full": {"layers": self.full_layers, "token_bytes": self.full_token_bytes},
            "sliding": {
                "layers": self.sliding_layers,
                "window": self.window,
                "token_bytes": self.sliding_token_bytes,
            },
        }


LAYER_KIND_LABELS = ("full", "sliding")  # the keys of `describe()` and `tokens_by_layer_kind`


def tokens_by_layer_kind(
    model: ModelConfig, page_size: int, parts_held: Callable[[Tier], tuple[int, int]]
) -> dict[str, dict[Tier, int]]:
    """The tokens of KV each tier holds for each layer kind (`LAYER_KIND_LABELS`), from
    `parts_held(tier)`: the tier's allocated pages (`full`) and the sliding parts among them
    (`sliding`: a split host pool and the remote tier keep them for some pages, every other pool
    for all; 0 for a model without a sliding layer). /health and the `tier_cached_tokens` gauge
    report these."""
    held = {tier: parts_held(tier) for tier in Tier}
    has_sliding = model.has_sliding_layers
    return {
        "full": {tier: pages * page_size for tier, (pages, _) in held.items()},
        "sliding": {
            tier: sliding * page_size if has_sliding else 0 for tier, (_, sliding) in held.items()
        },
    }


def held_by_layer_kind(
    model: ModelConfig, layout: PageLayout, parts_held: Callable[[Tier], tuple[int, int]]
) -> dict:
    """For /health: each layer kind's layers, window, bytes a token, and the tokens of it each
    tier holds (`tokens_by_layer_kind`)."""
    described = LayerKinds.of(model, layout).describe()
    for kind, by_tier in tokens_by_layer_kind(model, layout.page_size, parts_held).items():
        described[kind]["tokens_by_tier"] = {tier.label: tokens for tier, tokens in by_tier.items()}
    return described


def window_pages(end: int, window: int, page_size: int) -> range:
    """The page indexes whose sliding part a continuation from token `end` (a page boundary)
    reads: those overlapping tokens end - window + 1 .. end - 1."""
    assert end % page_size == 0, f"a reuse point is a page boundary: {end} % {page_size}"
    return range(max(0, end - window + 1) // page_size, end // page_size)


def kept_sliding_pages(
    num_pages: int, reuse_points: Iterable[int], window: int, page_size: int
) -> np.ndarray:
    """(num_pages,) bool: whether page i of a path keeps its sliding part, the path's reuse
    points (page boundaries, its end among them) given."""
    kept = np.zeros(num_pages, dtype=bool)
    for end in reuse_points:
        pages = window_pages(end, window, page_size)
        kept[pages.start : pages.stop] = True
    return kept


# pages kept besides the window before each reuse point: a chat's next turn re-renders the end
# of the last answer (an end-of-turn token for the end-of-sequence one), so its match ends up to
# a page before the cached path's end, and its window reaches that much further back
REUSE_MARGIN_PAGES = 2


class TreeNode(Protocol):
    """What the tree-shaped rule reads of a radix node."""

    num_tokens: int
    children: Mapping[Any, TreeNode]


def tree_kept_sliding(node: TreeNode, window: int, page_size: int) -> np.ndarray:
    """(num_pages,) bool: whether each page of `node` keeps its sliding part, the tree as it
    stands, with reuse points where a continuation is expected: the end of a path (a leaf) and
    a branch (two children or more). A node with one child is the middle of a path (a prefill
    chunk, a decoded page, an earlier turn since extended): its end is not one, and its pages
    keep the sliding part only where a reuse point further down the path reaches back into it.
    Each reuse point keeps `REUSE_MARGIN_PAGES` more pages than its window reads."""
    span = window - 1 + REUSE_MARGIN_PAGES * page_size
    reach = _reach_before_end(node, span)
    kept = np.zeros(node.num_tokens // page_size, dtype=bool)
    if reach > 0:
        kept[max(0, node.num_tokens - reach) // page_size :] = True
    return kept


def unread_sliding(node: TreeNode, held: Iterable[int], window: int, page_size: int) -> list[int]:
    """The indexes among `held` (pages of `node` whose copy holds the sliding part) that no
    reuse point reads as the tree stands (`tree_kept_sliding`): the parts a tier may free."""
    held = list(held)
    if not held:
        return []
    kept = tree_kept_sliding(node, window, page_size)
    return [index for index in held if not kept[index]]


def _reach_before_end(node: TreeNode, span: int) -> int:
    """How many tokens before `node`'s end a reuse point at or below it keeps (`span` before
    each; descendants further than `span` below reach no further than their own node)."""
    reach = span if len(node.children) != 1 else 0
    for child in node.children.values():
        if child.num_tokens < span:
            reach = max(reach, _reach_before_end(child, span) - child.num_tokens)
    return reach


def reusable_tokens(
    match_tokens: int, sliding_kept: Sequence[bool], window: int, page_size: int
) -> int:
    """The longest page boundary b <= match_tokens from which a request may continue: every
    page its sliding layers read (`window_pages(b)`) kept its sliding part. 0 always may."""
    for end in range(match_tokens - match_tokens % page_size, 0, -page_size):
        if all(sliding_kept[page] for page in window_pages(end, window, page_size)):
            return end
    return 0


def history_tokens(
    capacity_bytes: int,
    kinds: LayerKinds,
    path_tokens: int,
    page_size: int,
    reuse_every: int | None = None,
) -> tuple[int, int]:
    """Tokens of history a tier of `capacity_bytes` holds in cached paths of `path_tokens`
    (a reuse point at each path's end, and every `reuse_every` tokens if given): with every
    layer of every page, and with the rule's sliding parts only (the last path may be partly
    held: a tier holds pages, not whole paths)."""
    num_pages = -(-path_tokens // page_size)
    page_bytes = page_size * (kinds.full_token_bytes + kinds.sliding_token_bytes)
    all_layers = capacity_bytes * path_tokens // (num_pages * page_bytes)
    if kinds.window is None:
        return all_layers, all_layers
    end = num_pages * page_size
    points = [end] if reuse_every is None else [*range(reuse_every, end, reuse_every), end]
    kept = int(kept_sliding_pages(num_pages, points, kinds.window, page_size).sum())
    path_bytes = page_size * (num_pages * kinds.full_token_bytes + kept * kinds.sliding_token_bytes)
    return all_layers, capacity_bytes * path_tokens // path_bytes
