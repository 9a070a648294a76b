"""The storage tiers, fastest first: device, host, disk, and the remote store shared by
replicas (Redis)."""

import enum


class Tier(enum.IntEnum):
    """A KV tier. Lower value = faster; `Tier.DEVICE < Tier.HOST < Tier.DISK < Tier.REMOTE`."""

    DEVICE = 0
    HOST = 1
    DISK = 2
    REMOTE = 3

    @property
    def is_store(self) -> bool:
        """Pages held by a store outside memory (disk records, remote values), named by key."""
        return self in STORE_TIERS

    @property
    def label(self) -> str:
        """The lowercase name in metrics and HTTP fields: device, host, disk, remote."""
        return self.name.lower()


STORE_TIERS = frozenset({Tier.DISK, Tier.REMOTE})  # read and written through a store's I/O
