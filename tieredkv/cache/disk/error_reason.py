"""Why the disk tier refused a record or a store file: the `reason` of disk page errors."""

from __future__ import annotations

import enum


class DiskErrorReason(enum.Enum):
    """A refused disk record or file. The value is the `reason` label of
    `tieredkv_disk_page_errors_total` and the suffix of a set-aside store file."""

    CHECKSUM = "checksum"  # a record or superblock that does not verify: corrupt, torn, foreign
    FINGERPRINT = "fingerprint"  # a store file of another model, page layout or format version
    IO = "io"  # the operating system refused a read or a write

    @property
    def label(self) -> str:
        """The lowercase name used in metrics and file names ("checksum", "fingerprint", "io")."""
        return self.value
