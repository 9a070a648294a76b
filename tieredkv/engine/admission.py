"""What may join the batch now, beyond queue order: device room, and prefixes being computed.

Device room. A request admitted now will take device pages for its whole prompt, not only for
its first chunk: the pages its cached prefix is promoted into, then its suffix's pages as the
prefill proceeds. `DeviceRoom` counts what the requests already admitted hold (the distinct
pages of their page tables, the pages their promotions took) and will still take for their
prompts, against the device's size; a request is admitted only if its own prompt fits beside
them. Without that, a burst admits more prompts than the device holds, and they preempt one
another mid-prefill (a preempted prefix goes into the tree, but with no lower tier it is
dropped and computed again). Device pages the tree holds unlocked count as room: eviction
frees them. Decode pages are not reserved; a device that fills during decode still preempts.

Prefixes being computed (`lpm` only). A waiting request whose prompt shares more with a request
still prefilling than the cache holds would compute the same pages beside it; it waits instead
until those pages are in the tree (the running request inserts its full pages after every
step), or until that request leaves the batch (preempted or ended); its wait counts in its aging
as any wait does. The wait has no time bound of its own: computing the prefix a second time
beside the first would take the same prefill budget the first needs, so under a deep queue it
delays both, and the first's prefill is bounded by the prefill order's aging
(`queue_order`). A request preempted mid-prefill holds nobody: it is no longer admitted.
Prompts are compared by chained hashes of their full pages (within one namespace), so the
shared length is found by a binary search, not a token-by-token scan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tieredkv.cache.tier import Tier
from tieredkv.engine.request import Request


def prompt_page_hashes(request: Request, page_size: int) -> list[int]:
    """Hash `i` covers the namespace and the prompt's first `i + 1` full pages (cached)."""
    if request.prompt_page_hashes is None:
        prompt = request.spec.prompt_ids
        chain = hash(request.spec.namespace)
        hashes = []
        for start in range(0, len(prompt) - page_size + 1, page_size):
            chain = hash((chain, tuple(prompt[start : start + page_size])))
            hashes.append(chain)
        request.prompt_page_hashes = hashes
    return request.prompt_page_hashes


def shared_prompt_tokens(a: Request, b: Request, page_size: int) -> int:
    """Leading prompt tokens `a` and `b` share, in whole pages (0 across namespaces)."""
    hashes_a = prompt_page_hashes(a, page_size)
    hashes_b = prompt_page_hashes(b, page_size)
    low, high = 0, min(len(hashes_a), len(hashes_b))  # pages [0, low) are shared
    while low < high:  # a chain hash matches only if every page before it does too
        middle = (low + high + 1) // 2
        if hashes_a[middle - 1] == hashes_b[middle - 1]:
            low = middle
        else:
            high = middle - 1
    return low * page_size


def prefix_being_computed(
    request: Request, admitted: Sequence[Request], page_size: int
) -> Request | None:
    """An admitted request still prefilling a prefix that `request` shares beyond what its
    last match found in the cache (by a page or more), or None."""
    cached = sum(request.kv.matched_tokens_by_tier.values())
    for other in admitted:
        if other.kv_len >= len(other.spec.prompt_ids):
            continue  # its prompt is computed: what is shared is in the tree already
        if shared_prompt_tokens(request, other, page_size) >= cached + page_size:
            return other
    return None


def _pages(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


def prompt_pages(request: Request, page_size: int) -> int:
    """Device pages the request's prompt and its first generated token take."""
    return _pages(len(request.spec.prompt_ids) + 1, page_size)


class DeviceRoom:
    """Device pages left for new admissions this step (see the module docstring)."""

    def __init__(
        self,
        device_pages: int,
        running: Sequence[Request],
        promoting: Sequence[Request],
        page_size: int,
        held_pages: Callable[[list[int]], int] = len,
    ) -> None:
        """`held_pages`: what pages held take, in whole pages (a split device pool's pages
        without a sliding part take less)."""
        self.page_size = page_size
        held: set[int] = set()
        still_needed = 0
        for request in running:
            held.update(request.page_table)
            still_needed += max(0, prompt_pages(request, page_size) - len(request.page_table))
        for request in promoting:  # its promotion took pages for its host and disk prefix
            cached = sum(request.kv.matched_tokens_by_tier.values()) // page_size
            device = request.kv.matched_tokens_by_tier[Tier.DEVICE] // page_size
            held_by_promotion = cached - device
            still_needed += held_by_promotion + max(0, prompt_pages(request, page_size) - cached)
        self.free_pages = device_pages - held_pages(list(held)) - still_needed

    def need(self, request: Request) -> int:
        """Pages the waiting `request` would take: its prompt's, less its device match."""
        on_device = request.kv.matched_tokens_by_tier[Tier.DEVICE] // self.page_size
        return max(0, prompt_pages(request, self.page_size) - on_device)

    def fits(self, request: Request) -> bool:
        """The waiting `request`'s prompt fits in what is left."""
        return self.need(request) <= self.free_pages

    def take(self, request: Request) -> None:
        """Count the admitted `request` in."""
        self.free_pages -= self.need(request)

    def keep(self, request: Request, shared_tokens: int) -> bool:
        """Keep room for the waiting `request`, which waits for `shared_tokens` of its prompt
        to be computed by an admitted request (whose pages are counted already): the pages
        beyond them. False (nothing kept): they do not fit in what is left."""
        pages = max(0, prompt_pages(request, self.page_size) - shared_tokens // self.page_size)
        if pages > self.free_pages:
            return False
        self.free_pages -= pages
        return True
