"""Asking the remote store for the pages past a local match.

A prompt's pages past what the tree matched are named by chaining their keys on from the last
matched page (or the namespace's root): `H(parent_key, tokens)`, as every replica names them.
One pipelined round trip asks the store how many of the leading ones it holds (and, for a model
with sliding-window layers, which of those it holds without their sliding part: the copy's
gaps); the caller attaches those to the tree as remote copies, to be promoted like disk pages.
"""

from __future__ import annotations

from tieredkv.cache.index.match_results import MatchResult
from tieredkv.cache.index.page_key import chain_packed_keys
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.remote.remote_tier import RemoteTier

REMOTE_LOOKUP_MAX_PAGES = 512  # pages one look-up asks the remote store for (8k tokens at 16)


def remote_keys_past(
    remote: RemoteTier, tree: RadixTree, match: MatchResult, query: bytes
) -> tuple[list[bytes], frozenset[int]]:
    """The keys of the pages of packed `query` right after `match` that `remote` holds, in
    order: at most REMOTE_LOOKUP_MAX_PAGES, and never the page of the query's last token (a
    match reuses at most `len(query) - 1` tokens). Empty when there are none to ask for. And
    the indexes among them of the pages held without their sliding part."""
    max_pages = max(match.num_tokens - 1, 0) // tree.page_size
    wanted = min(max_pages - match.num_pages, REMOTE_LOOKUP_MAX_PAGES)
    if wanted <= 0:
        return [], frozenset()
    last = match.last_node
    parent_key = match.namespace_key if last is None else tree.page_keys(last)[-1]
    start = match.num_pages * tree.page_bytes
    run = query[start : start + wanted * tree.page_bytes]
    keys = chain_packed_keys(parent_key, run, tree.page_size)
    count, gaps = remote.lookup(keys)
    return keys[:count], gaps
