"""Pinned prefixes: prompts whose pages stay at least on the host tier until unpinned (the
seeds' "warm the cache at start"), up to a budget of pages per owner (a tenant: all its
namespaces together, `tieredkv.tenants`; any other namespace alone) and a total over all pins.

A pin holds a prompt's full pages: the node its last full page ends at, and every node above
it, count one pin more (`Residency.pin`). Eviction never takes a pinned node's host or disk
copy (`eviction.PINNED_TIERS`): its device copy may leave (to host), its pages never go below
host, and its disk copy carries it across a restart. Pinning needs the prompt's pages
in the tree (the engine computes the prompt first: `AsyncEngine.pin`). Each pin counts its
own full pages against its owner's budget and the total (two pins sharing a prefix count it
twice).

The registry is saved as JSON beside the disk store (`pins.json`, mode 0600: it names tenants
and holds token ids; written atomically on every change) and read at start: those pins are
pinned again once the server is up (their pages come back from disk), so pins survive a
restart.

`PinRegistry` keeps the pins; `Pinning` makes and releases them over the index and the tiers.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tieredkv.cache.disk.directory import PINS_FILE
from tieredkv.cache.index.match_results import PathEnd
from tieredkv.cache.index.radix_index import RadixIndex
from tieredkv.cache.residency.demotion import Demoter
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.tier import Tier
from tieredkv.cache.tier_pools import TierPools
from tieredkv.errors import RequestError
from tieredkv.tenants import namespace_owner

log = logging.getLogger(__name__)


class PinError(RequestError):
    """A pin cannot be made (HTTP 400 with `code`)."""


@dataclass
class Pin:
    namespace: str
    token_ids: tuple[int, ...]
    num_pages: int
    node: PathEnd | None = None  # None: read from pins.json, not pinned again yet


PinKey = tuple[str, tuple[int, ...]]


class PinRegistry:
    """The pins by (namespace, token ids); engine thread only. `budget_pages` bounds each
    owner's pins (`namespace_owner`), `total_budget_pages` all of them."""

    def __init__(self, budget_pages: int, total_budget_pages: int, directory: Path | None) -> None:
        self.budget_pages = budget_pages
        self.total_budget_pages = total_budget_pages
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

    def pages_of_owner(self, namespace: str, besides: Pin | None = None) -> int:
        """The pages pinned by `namespace`'s owner, in all its namespaces."""
        owner = namespace_owner(namespace)
        return sum(
            pin.num_pages
            for pin in self._pins.values()
            if namespace_owner(pin.namespace) == owner and pin is not besides
        )

    def total_pages(self, besides: Pin | None = None) -> int:
        return sum(pin.num_pages for pin in self._pins.values() if pin is not besides)

    def usage(self, namespace: str) -> dict[str, int]:
        """The pages pinned in `namespace`, by its owner and by all, and the budgets."""
        return {
            "namespace_pinned_pages": self.pages_in(namespace),
            "budget_pages": self.budget_pages,
            "owner_pinned_pages": self.pages_of_owner(namespace),
            "total_pinned_pages": self.total_pages(),
            "total_budget_pages": self.total_budget_pages,
        }

    def describe(self) -> dict:
        """Every pin (`held`: pinned in the tree, not only read from the file) and the
        budgets."""
        pins = [
            {"namespace": pin.namespace, "token_ids": pin.token_ids,
             "pinned_pages": pin.num_pages, "held": pin.node is not None}
            for pin in self._pins.values()
        ]  # fmt: skip
        return {
            "pins": pins,
            "budget_pages": self.budget_pages,
            "total_pinned_pages": self.total_pages(),
            "total_budget_pages": self.total_budget_pages,
        }

    def add(self, pin: Pin) -> None:
        self._pins[(pin.namespace, pin.token_ids)] = pin
        self._save()

    def remove(self, pin: Pin) -> None:
        self._pins.pop((pin.namespace, pin.token_ids), None)
        self._save()

    def waiting(self) -> list[Pin]:
        """Pins read from the file, or flushed, that are not pinned again yet."""
        return [pin for pin in self._pins.values() if pin.node is None]

    def held(self) -> list[Pin]:
        """Pins whose pages the tree holds."""
        return [pin for pin in self._pins.values() if pin.node is not None]

    def __len__(self) -> int:
        return len(self._pins)

    def _load(self) -> None:
        if self._path is None or not self._path.is_file():
            return
        try:
            if self._path.stat().st_mode & 0o077:  # readable by others: made private
                os.chmod(self._path, 0o600)
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
            _write_private(temporary, json.dumps(entries).encode())
            os.replace(temporary, self._path)
        except OSError as exc:  # a full disk: the pins hold now, a restart may forget them
            log.error("could not save %s: %s", self._path, exc)


class Pinning:
    """Making and releasing pins: the path's pin counts (residency's), copies down to host and
    disk, the registry's entries (engine thread only)."""

    def __init__(
        self,
        registry: PinRegistry,
        index: RadixIndex,
        residency: Residency,
        demoter: Demoter,
        pools: TierPools,
        host_enabled: bool,
    ) -> None:
        self.pins = registry
        self.index = index
        self.residency = residency
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
        self._check_budgets(namespace, num_pages, besides=pin)
        node = self.index.full_path(token_ids, namespace)
        if node is None or not self.residency.path_held_in(node, (Tier.DEVICE, Tier.HOST)):
            return None
        self.residency.pin(node, +1)
        tiers = [tier for tier in (Tier.HOST, Tier.DISK) if self.pools.enabled(tier)]
        if (full := self.demoter.copy_path(node, tiers)) is not None:
            self.residency.pin(node, -1)
            message = f"the {full.label} tier has no room for this prefix"
            raise PinError(message, "prompt", "tier_full")
        pin = pin or Pin(namespace, tuple(token_ids), num_pages)
        pin.node = node
        self.pins.add(pin)
        return pin

    def _check_budgets(self, namespace: str, num_pages: int, besides: Pin | None) -> None:
        used = self.pins.pages_of_owner(namespace, besides)
        if used + num_pages > self.pins.budget_pages:
            message = (
                f"pinning {num_pages} pages would exceed the pin budget of this namespace's "
                f"owner, all its namespaces together ({used} of {self.pins.budget_pages} "
                "pages pinned)"
            )
            raise PinError(message, "prompt", "pin_budget_exceeded")
        total = self.pins.total_pages(besides)
        if total + num_pages > self.pins.total_budget_pages:
            message = (
                f"pinning {num_pages} pages would exceed the server's total pin budget "
                f"({total} of {self.pins.total_budget_pages} pages pinned)"
            )
            raise PinError(message, "prompt", "pin_total_budget_exceeded")

    def release_flushed(self, within: Callable[[str], bool] | None) -> None:
        """A flush of the namespaces `within` accepts (None: all): their pins let their pages
        go (matched no more) and wait to be pinned again, in the new generation."""
        for pin in self.pins.held():
            if (within is None or within(pin.namespace)) and pin.node is not None:
                self.residency.pin(pin.node, -1)
                pin.node = None

    def unpin(self, token_ids: Sequence[int], namespace: str) -> bool:
        """See `TieredCache.unpin`."""
        pin = self.pins.get(namespace, token_ids)
        if pin is None:
            return False
        if pin.node is not None:
            self.residency.pin(pin.node, -1)
        self.pins.remove(pin)
        return True


def _write_private(path: Path, data: bytes) -> None:
    """Write `path` as mode 0600 whatever the umask or an older file's mode, never through a
    symlink planted in its place."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    with os.fdopen(os.open(path, flags, 0o600), "wb") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(data)
