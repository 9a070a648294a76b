"""`check_integrity()`: reconcile the cache's bookkeeping with its pools.

  - every used page of every tier has exactly one owner: a node's copy, a request's private
    pages, or a ticket (a destination in flight, or a source it frees when applied);
  - every lock count equals its live holders plus its children's counts;
  - closure: for each tier T, nodes with a copy in T or faster (in flight counted) are closed
    under "parent of"; so are nodes with a disk copy; committed copies likewise;
  - each node's pages and tokens agree, and the keys it knows (keys are computed only when a
    page first needs one) equal the chain from the namespace root, recomputed here from the
    token ids the packed run decodes to;
  - a transfer's source copy stays committed until its bytes arrive, and an arrived copy is
    committed as soon as its parent's copy allows;
  - a copy in a pool kept a layer at a time has every page without a sliding part among its
    gaps (a read counts on the part of every other page);
  - each namespace's page counts per tier (`Residence.usage` and `arriving`, what fair
    eviction reads) equal the pages of its nodes' copies and of its copies in flight.
It walks the whole tree: for tests and the debug endpoint, never the hot path.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from tieredkv.cache.index.page_key import page_key
from tieredkv.cache.index.radix_index import RadixIndex
from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.token_run import TOKEN_BYTES
from tieredkv.cache.pools.layer_pages import LayerPages
from tieredkv.cache.residency.residence import NO_COPY
from tieredkv.cache.tier import Tier
from tieredkv.cache.tier_pools import TierPools
from tieredkv.cache.transfer.transfer_queue import PartState, TransferPart, TransferTicket

OWNERS = ("node", "request", "ticket")


@dataclass(frozen=True)
class IntegrityResult:
    """`ok` iff `problems` is empty; `page_counts[tier][owner]` also counts "free" pages."""

    ok: bool
    problems: list[str] = field(default_factory=list)
    page_counts: dict[str, dict[str, int]] = field(default_factory=dict)


class _Ledger:
    def __init__(self) -> None:
        self.owner: dict[Tier, dict[int, str]] = {tier: {} for tier in Tier}
        self.problems: list[str] = []

    def claim(self, tier: Tier, pages: list[int], owner: str, what: object) -> None:
        for page in pages:
            if page in self.owner[tier]:
                self.problems.append(f"{tier.label} page {page} owned twice ({what})")
            self.owner[tier][page] = owner


def _live_parts(
    index: RadixIndex, transfers: Collection[TransferTicket]
) -> list[TransferPart[RadixNode]]:
    parts = {id(p): p for node in index.tree.iter_nodes() for p in node.residence.inflight.values()}
    for ticket in transfers:
        parts.update({id(p): p for p in ticket.parts if p.state is PartState.DETACHED})
    return list(parts.values())


def _check_node(
    index: RadixIndex, node: RadixNode, chain_ends: dict[RadixNode, bytes], problems: list[str]
) -> None:
    """Check one node; `chain_ends` holds the recomputed last key of every node checked so far
    (parents come first)."""
    ps, parent = index.page_size, node.parent
    assert parent is not None
    if node.num_tokens * TOKEN_BYTES != len(node.packed) or node.num_pages == 0:
        problems.append(f"{node}: {len(node.packed)} bytes of tokens, {node.num_pages} pages")
    if node.num_tokens != node.num_pages * ps:
        problems.append(f"{node}: {node.num_tokens} tokens for {node.num_pages} pages")
    if parent.children.get(node.page_packed(0, ps)) is not node or not node.attached:
        problems.append(f"{node}: not reachable from its parent")
    _check_keys(node, chain_ends, problems, ps)
    _check_residence(node, problems)
    expected_locks = index.lock_holders.get(node, 0) + sum(
        child.lock_count for child in node.children.values()
    )
    if node.lock_count != expected_locks:
        problems.append(f"{node}: lock count {node.lock_count}, holders say {expected_locks}")


def _check_residence(node: RadixNode, problems: list[str]) -> None:
    """The node's copies and transfers fit it and keep the closure invariants; its parent's
    counts of its children by rank are right."""
    record, parent = node.residence, node.parent
    assert parent is not None
    for tier, pages in record.copies.items():
        if len(pages) != node.num_pages:
            problems.append(f"{node}: {tier.label} copy has {len(pages)} pages")
        if not record.may_commit(tier):
            problems.append(f"{node}: committed {tier.label} copy without the parent's")
    for tier, gaps in record.sliding_gaps.items():
        if tier not in record.copies or not gaps or not gaps <= set(range(node.num_pages)):
            problems.append(f"{node}: sliding gaps {sorted(gaps)} of its {tier.label} copy")
    for tier, part in record.inflight.items():
        if part.node is not node or part.dst_tier is not tier:
            problems.append(f"{node}: stale transfer part towards {tier.label}")
        if part.state is PartState.DETACHED:
            problems.append(f"{node}: a detached transfer part towards {tier.label}")
        if len(part.dst_pages) != node.num_pages or tier in record.copies:
            problems.append(f"{node}: transfer towards {tier.label} does not fit the node")
        arrived = part.state is PartState.ARRIVED
        if arrived and record.may_commit(tier):
            problems.append(f"{node}: its {tier.label} copy arrived and was never committed")
        if not arrived and record.copies.get(part.src_tier) != part.src_pages:
            problems.append(f"{node}: the source of its copy towards {tier.label} is gone")
    for tier in Tier:
        if record.in_closure(tier) and not parent.residence.in_closure(tier):
            problems.append(f"{node}: in the {tier.label} closure, its parent is not")
    if record.has_disk_copy() and not parent.residence.has_disk_copy():
        problems.append(f"{node}: has a disk copy, its parent has none")
    if record.empty() and not (node.lock_count or record.retain_count):
        problems.append(f"{node}: holds nothing and is neither locked nor retained")
    ranks, on_disk = [0] * (NO_COPY + 1), 0
    for child in node.children.values():
        rank, child_on_disk = child.residence.rank()
        ranks[rank] += 1
        on_disk += child_on_disk
    if ranks != record.child_ranks or on_disk != record.children_on_disk:
        problems.append(f"{node}: child counts {record.child_ranks}/{record.children_on_disk}")


def _check_keys(
    node: RadixNode, chain_ends: dict[RadixNode, bytes], problems: list[str], ps: int
) -> None:
    """The keys `node` knows equal the chain recomputed from its tokens."""
    parent = node.parent
    assert parent is not None
    key = chain_ends.get(parent) if parent.parent is not None else parent.root_key
    if key is None:
        problems.append(f"{node}: its parent is not in the tree")
        return
    if len(node.keys) > node.num_pages:
        problems.append(f"{node}: {len(node.keys)} keys for {node.num_pages} pages")
    for i in range(node.num_pages):
        key = page_key(key, node.page_ids(i, ps))
        if i < len(node.keys) and node.keys[i] != key:
            problems.append(f"{node}: page {i} key does not chain")
    chain_ends[node] = key


def check_integrity(
    index: RadixIndex, pools: TierPools, transfers: Collection[TransferTicket]
) -> IntegrityResult:
    """Check the index's tree, locks and lent pages against `pools`, with `transfers` the
    tickets in flight (submitted, not yet applied)."""
    ledger = _Ledger()
    problems = ledger.problems
    chain_ends: dict[RadixNode, bytes] = {}
    usage: dict[bytes, list[int]] = {}  # per namespace root key: committed pages per tier
    arriving: dict[bytes, list[int]] = {}  # and pages in flight towards each tier
    for node in index.tree.iter_nodes():
        _check_node(index, node, chain_ends, problems)
        record = node.residence
        for tier, pages in record.copies.items():
            ledger.claim(tier, pages, "node", node)
            usage.setdefault(node.root_key, [0] * len(Tier))[tier] += len(pages)
            pool = pools.get(tier)
            if isinstance(pool, LayerPages):
                unheld = pool.lacking(pages) - record.sliding_gaps.get(tier, frozenset())
                if unheld:
                    problems.append(f"{node}: {tier.label} pages {sorted(unheld)} lack a part")
        for tier in record.inflight:
            arriving.setdefault(node.root_key, [0] * len(Tier))[tier] += node.num_pages
        root = index.tree.roots.get(node.root_key, node).residence
        if record.usage is not root.usage or record.arriving is not root.arriving:
            problems.append(f"{node}: counts its pages apart from its namespace")
    for key, root_node in index.tree.roots.items():
        root = root_node.residence
        counted = usage.get(key, [0] * len(Tier))
        if root.usage != counted:
            problems.append(f"namespace pages per tier {root.usage}, its copies hold {counted}")
        on_the_way = arriving.get(key, [0] * len(Tier))
        if root.arriving != on_the_way:
            problems.append(
                f"namespace pages arriving per tier {root.arriving}, in flight {on_the_way}"
            )
    ledger.claim(Tier.DEVICE, sorted(index.private_pages), "request", "private")
    for part in _live_parts(index, transfers):
        ledger.claim(part.dst_tier, part.dst_pages, "ticket", part.ticket)
    for ticket in transfers:
        for tier, pages in ticket.release:
            ledger.claim(tier, pages, "ticket", ticket)
    for holder in index.lock_holders:
        if not holder.attached:
            problems.append(f"lock held on detached {holder}")
    page_counts = {}
    for tier in Tier:
        owned = ledger.owner[tier]
        num_used = pools.num_pages(tier) - pools.num_free(tier)
        if len(owned) != num_used:
            problems.append(f"{tier.label}: {num_used} pages used, {len(owned)} owned")
        if tier in pools:
            freed = [page for page in owned if pools[tier].is_free(page)]
            problems.extend(f"{tier.label} page {page} owned but free" for page in freed)
        counts = dict.fromkeys(OWNERS, 0)
        for owner in owned.values():
            counts[owner] += 1
        counts["free"] = pools.num_free(tier)
        page_counts[tier.label] = counts
    return IntegrityResult(not problems, problems, page_counts)
