"""The storage tiers, fastest first."""

import enum


class Tier(enum.IntEnum):
    """A KV tier. Lower value = faster; `Tier.DEVICE < Tier.HOST < Tier.DISK`."""

    DEVICE = 0
    HOST = 1
    DISK = 2

    @property
    def label(self) -> str:
        """The lowercase name used in metrics and HTTP fields ("device", "host", "disk")."""
        return self.name.lower()
