"""Pinned prefixes: prompts whose pages stay at least on the host tier until unpinned (the
seeds' "warm the cache at start"), up to a budget of pages per namespace.

A pin holds a prompt's full pages: the node its last full page ends at, and every node above
it, count one pin more (`RadixNode.pin_count`). Eviction never takes a pinned node's host or
disk copy (`eviction.PINNED_TIERS`): its device copy may leave (to host), its pages never go
below host, and its disk copy carries it across a restart. Pinning needs the prompt's pages
in the tree (the engine computes the prompt first: `AsyncEngine.pin`). Each pin counts its
own full pages against its namespace's budget (two pins sharing a prefix count it twice).

The registry is saved as JSON beside the disk store (`pins.json`, written atomically on every
change) and read at start: those pins are pinned again once the server is up (their pages
come back from disk), so pins survive a restart.

`PinRegistry` keeps the pins; `Pinning` makes and releases them over the index and the tiers.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tieredkv.cache.disk.directory import PINS_FILE
from tieredkv.cache.index.radix_index import RadixIndex
from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.residency.demotion import Demoter
from tieredkv.cache.tier import Tier
from tieredkv.cache.tier_pools import TierPools
from tieredkv.errors import RequestError

log = logging.getLogger(__name__)


class PinError(RequestError):
    """A pin cannot be made (HTTP 400 with `code`)."""


@dataclass
class Pin:
    namespace: str
    token_ids: tuple[int, ...]
    num_pages: int
    node: RadixNode | None = None  # None: read from pins.json, not pinned again yet


PinKey = tuple[str, tuple[int, ...]]


class PinRegistry:
    """The pins by (namespace, token ids); engine thread only."""

    def __init__(self, budget_pages: int, directory: Path | None) -> None:
        self.budget_pages = budget_pages
        self._path = directory / PINS_FILE if directory is not None else None
        self._pins: dict[PinKey, Pin] = {}
        self._load()

    def get(self, namespace: str, token_ids: Sequence[int]) -> Pin | None:
        return self._pins.get((namespace, tuple(token_ids)))

    def pages_in(self, namespace: str, besides: Pin | None = None) -> int:
        return sum(
            pin.num_pages
            for pin in self._pins.values()
            if pin.namespace == namespace and pin is not besides
        )

    def add(self, pin: Pin) -> None:
        self._pins[(pin.namespace, pin.token_ids)] = pin
        self._save()

    def remove(self, pin: Pin) -> None:
        self._pins.pop((pin.namespace, pin.token_ids), None)
        self._save()

    def waiting(self) -> list[Pin]:
        """Pins read from the file that are not pinned again yet."""
        return [pin for pin in self._pins.values() if pin.node is None]

    def __len__(self) -> int:
        return len(self._pins)

    def _load(self) -> None:
        if self._path is None or not self._path.is_file():
            return
        try:
            entries = json.loads(self._path.read_text())
            for entry in entries:
                ids = tuple(int(i) for i in entry["token_ids"])
                pin = Pin(str(entry["namespace"]), ids, int(entry["num_pages"]))
                self._pins[(pin.namespace, ids)] = pin
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("%s is unreadable (%s): starting with no pins", self._path, exc)
            self._pins = {}

    def _save(self) -> None:
        if self._path is None:
            return
        entries = [
            {"namespace": p.namespace, "token_ids": list(p.token_ids), "num_pages": p.num_pages}
            for p in self._pins.values()
        ]
        temporary = self._path.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps(entries))
            os.replace(temporary, self._path)
        except OSError as exc:  # a full disk: the pins hold now, a restart may forget them
            log.error("could not save %s: %s", self._path, exc)


class Pinning:
    """Making and releasing pins: the path's pin counts in the index, copies down to host and
    disk, the registry's entries (engine thread only)."""

    def __init__(
        self,
        registry: PinRegistry,
        index: RadixIndex,
        demoter: Demoter,
        pools: TierPools,
        host_enabled: bool,
    ) -> None:
        self.pins = registry
        self.index = index
        self.demoter = demoter
        self.pools = pools
        self.host_enabled = host_enabled
        self.page_size = pools.layout.page_size

    def pin(self, token_ids: Sequence[int], namespace: str) -> Pin | None:
        """See `TieredCache.pin`."""
        pin = self.pins.get(namespace, token_ids)
        if pin is not None and pin.node is not None:
            return pin  # pinned already
        if not self.host_enabled:
            raise PinError("pinning needs a host tier (--host-cache-size)", "prompt", "no_host")
        num_pages = len(token_ids) // self.page_size
        if num_pages == 0:
            message = f"a pinned prompt needs at least one full page ({self.page_size} tokens)"
            raise PinError(message, "prompt", "prompt_too_short")
        used = self.pins.pages_in(namespace, besides=pin)
        if used + num_pages > self.pins.budget_pages:
            message = (
                f"pinning {num_pages} pages would exceed this namespace's pin budget "
                f"({used} of {self.pins.budget_pages} pages pinned)"
            )
            raise PinError(message, "prompt", "pin_budget_exceeded")
        node = self.index.full_path(token_ids, namespace)
        if node is None or any(
            Tier.DEVICE not in n.copies and Tier.HOST not in n.copies for n in node.path()
        ):
            return None
        self.index.pin(node, +1)
        for path_node in node.path():  # parents first
            for tier in (Tier.HOST, Tier.DISK):
                if not self.pools.enabled(tier) or tier in path_node.copies:
                    continue
                if tier in path_node.inflight:
                    continue
                if not self.demoter.copy_down(path_node, tier, frees_source=False):
                    self.index.pin(node, -1)
                    message = f"the {tier.label} tier has no room for this prefix"
                    raise PinError(message, "prompt", "tier_full")
        pin = pin or Pin(namespace, tuple(token_ids), num_pages)
        pin.node = node
        self.pins.add(pin)
        return pin

    def unpin(self, token_ids: Sequence[int], namespace: str) -> bool:
        """See `TieredCache.unpin`."""
        pin = self.pins.get(namespace, token_ids)
        if pin is None:
            return False
        if pin.node is not None:
            self.index.pin(pin.node, -1)
        self.pins.remove(pin)
        return True
