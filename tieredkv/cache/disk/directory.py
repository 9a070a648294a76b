"""Opening the disk store's directory and file: lock, validate or set aside, preallocate.

Directory contents (anything else is logged and left alone):

    tieredkv.lock                     the flock that makes one process own the directory
    pages-0.tkv                       the store file (see disk_format)
    pages-0.tkv.setaside-<reason>     the last file set aside for <reason> (replaced by the next)

Keeping one set-aside file per reason bounds the disk use of repeated mismatches.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.format import (
    SUPERBLOCK_BYTES,
    Superblock,
    SuperblockError,
    align_up,
    decode_superblock,
    header_bytes_for,
)
from tieredkv.cache.page_layout import PageLayout, aligned_empty
from tieredkv.cache.page_record import fingerprint_digest
from tieredkv.errors import DiskStoreError

logger = logging.getLogger(__name__)

LOCK_FILE = "tieredkv.lock"
STORE_FILE = "pages-0.tkv"
PINS_FILE = "pins.json"  # the pinned prefixes (`tieredkv.cache.pins`), kept beside the store
GENERATIONS_FILE = "generations.json"  # the flush generations (`cache.flush_generations`)
SET_ASIDE_INFIX = ".setaside-"


@dataclass(frozen=True)
class OpenedFile:
    """An open, validated store file."""

    handle: int
    superblock: Superblock
    intact_bytes: int  # file length found at open; records beyond it were lost to truncation


def superblock_for(
    layout: PageLayout, fingerprint: bytes, capacity_bytes: int, parts: str = ""
) -> Superblock:
    """The geometry of a store for `layout` that fits in `capacity_bytes`; `parts` (a model
    with sliding layers: `PageParts.describe()`) joins the layout text, so a store whose records
    may lack sliding parts is set aside by a build that would not know it."""
    header_bytes = header_bytes_for(layout.page_size)
    record_bytes = align_up(layout.page_bytes)
    num_slots = (capacity_bytes - SUPERBLOCK_BYTES) // (header_bytes + record_bytes)
    block = Superblock(
        header_bytes=header_bytes,
        record_bytes=record_bytes,
        num_slots=max(num_slots, 0),
        page_size=layout.page_size,
        dtype=str(layout.dtype).removeprefix("torch."),
        fingerprint_digest=fingerprint_digest(fingerprint),
        layout=layout.describe() + (f";{parts}" if parts else ""),
    )
    while block.num_slots > 0 and block.file_bytes > capacity_bytes:  # header region padding
        block = dataclasses.replace(block, num_slots=block.num_slots - 1)
    if block.num_slots == 0:
        raise DiskStoreError(f"disk cache size {capacity_bytes} B cannot hold one page record")
    return block


def prepare_directory(directory: Path) -> None:
    """Create the directory (mode 0o700) if needed, refuse one that another user could write
    into (owned by someone else, or group- or world-writable: whoever can write there can plant
    records), a symlink (its target can be swapped), or one under a directory that others can
    write without the sticky bit (they could rename ours away and put theirs in its place), and
    log files that are not ours."""
    _refuse_symlink(directory)
    _refuse_open_parents(directory)
    try:
        if not directory.exists():
            directory.mkdir(mode=0o700, parents=True)
            os.chmod(directory, 0o700)  # exact mode whatever the umask
        status = directory.stat()
        entries = sorted(path.name for path in directory.iterdir())
    except OSError as error:
        raise DiskStoreError(f"disk cache directory {directory}: {error}") from error
    if status.st_uid != os.geteuid():
        raise DiskStoreError(
            f"disk cache directory {directory} is owned by uid {status.st_uid}, not by this "
            f"process's user (uid {os.geteuid()}); use a directory of your own"
        )
    if status.st_mode & 0o022:
        raise DiskStoreError(
            f"disk cache directory {directory} is group- or world-writable "
            f"(mode {stat.S_IMODE(status.st_mode):o}); run `chmod go-w {directory}`"
        )
    for name in entries:
        if name not in (LOCK_FILE, STORE_FILE, PINS_FILE, GENERATIONS_FILE) and not name.startswith(
            STORE_FILE + SET_ASIDE_INFIX
        ):
            logger.warning("disk cache directory %s: ignoring foreign file %r", directory, name)


def _refuse_symlink(directory: Path) -> None:
    """Checked with lstat: the link itself, never what it points to."""
    try:
        is_link = stat.S_ISLNK(os.lstat(directory).st_mode)
    except FileNotFoundError:
        return
    except OSError as error:
        raise DiskStoreError(f"disk cache directory {directory}: {error}") from error
    if is_link:
        raise DiskStoreError(
            f"disk cache directory {directory} is a symlink (to {os.readlink(directory)}); "
            "give the real directory's path"
        )


def _refuse_open_parents(directory: Path) -> None:
    """Every existing directory above `directory`, as written and with symlinks resolved, up to
    /: none may be writable by group or others unless sticky (as /tmp is)."""
    written = Path(os.path.abspath(directory)).parents
    resolved = Path(os.path.realpath(directory.parent))
    for parent in dict.fromkeys([resolved, *resolved.parents, *written]):
        try:
            mode = parent.stat().st_mode
        except FileNotFoundError:
            continue  # created below, 0o700 at the end of the chain
        except OSError as error:
            raise DiskStoreError(f"disk cache directory {directory}: {parent}: {error}") from error
        if mode & 0o022 and not mode & stat.S_ISVTX:
            raise DiskStoreError(
                f"disk cache directory {directory} is under {parent}, which group or others may "
                f"write (mode {stat.S_IMODE(mode):o}, not sticky); run `chmod go-w {parent}` or "
                "use a directory under a private parent"
            )


def lock_directory(io: DiskIOBackend, directory: Path) -> int:
    """Take the directory's exclusive flock; DiskStoreError if another owner holds it."""
    try:
        return io.lock(directory / LOCK_FILE)
    except BlockingIOError as error:
        raise DiskStoreError(
            f"disk cache directory {directory} is in use by another tieredkv process or store "
            f"(exclusive flock on {directory / LOCK_FILE}); give each server its own directory"
        ) from error
    except OSError as error:
        raise DiskStoreError(f"cannot lock disk cache directory {directory}: {error}") from error


def _mismatch(found: Superblock, wanted: Superblock) -> str | None:
    for name in ("fingerprint_digest", "page_size", "dtype", "layout", "header_bytes"):
        if getattr(found, name) != getattr(wanted, name):
            return f"{name} differs"
    if found.record_bytes != wanted.record_bytes:
        return f"record size {found.record_bytes}, want {wanted.record_bytes}"
    if found.num_slots > wanted.num_slots:
        return f"holds {found.num_slots} pages, more than the configured {wanted.num_slots}"
    return None


def open_store_file(
    io: DiskIOBackend,
    directory: Path,
    wanted: Superblock,
    count_error: Callable[[DiskErrorReason], None],
) -> OpenedFile:
    """Reopen a compatible store file or set it aside, else create a fresh one.

    A compatible file with fewer pages than configured (e.g. shrunk earlier for lack of space)
    is kept as it is. A fresh file that cannot be preallocated halves until it fits. Any
    OSError becomes a DiskStoreError (a symlink in place of the file: ELOOP)."""
    path = directory / STORE_FILE
    try:
        if path.exists() or path.is_symlink():
            opened = _reopen(io, path, wanted, count_error)
            if opened is not None:
                return opened
        return _create(io, path, wanted)
    except OSError as error:
        raise DiskStoreError(f"disk store {path}: {error}") from error


def _reopen(
    io: DiskIOBackend,
    path: Path,
    wanted: Superblock,
    count_error: Callable[[DiskErrorReason], None],
) -> OpenedFile | None:
    try:
        handle = io.open(path, 0, create=False)
    except OSError as error:
        raise DiskStoreError(f"cannot open disk store {path}: {error}") from error
    intact_bytes = io.size(handle)
    block = aligned_empty(SUPERBLOCK_BYTES)
    try:
        io.pread(handle, 0, min(SUPERBLOCK_BYTES, intact_bytes), block)
        found = decode_superblock(block.tobytes()[:intact_bytes])
        reason, why = DiskErrorReason.FINGERPRINT, _mismatch(found, wanted)
        if why is None and intact_bytes < found.file_bytes:
            logger.warning("disk store %s is truncated to %d bytes; extending", path, intact_bytes)
            io.preallocate(handle, found.file_bytes)
    except SuperblockError as error:
        reason, why = error.reason, str(error)
    except OSError as error:
        reason, why = DiskErrorReason.IO, f"unreadable or not extendable: {error}"
    if why is None:
        return OpenedFile(handle, found, intact_bytes)
    io.close(handle)
    count_error(reason)
    aside = path.with_name(path.name + SET_ASIDE_INFIX + reason.label)
    os.replace(path, aside)
    logger.warning("disk store %s set aside as %s (%s): %s", path, aside.name, reason.label, why)
    return None


def _create(io: DiskIOBackend, path: Path, wanted: Superblock) -> OpenedFile:
    block = wanted
    while True:
        try:
            handle = io.open(path, block.file_bytes, create=True)
            break
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise DiskStoreError(f"cannot create disk store {path}: {error}") from error
            if block.num_slots == 1:
                raise DiskStoreError(f"no space for a disk store at {path}") from error
            smaller = dataclasses.replace(block, num_slots=block.num_slots // 2)
            logger.warning(
                "no space for a %d-byte disk store at %s; trying %d bytes",
                block.file_bytes,
                path,
                smaller.file_bytes,
            )
            block = smaller
    try:
        io.pwrite(handle, 0, block.encode())
    except OSError as error:
        io.close(handle)
        raise DiskStoreError(f"cannot write the superblock of {path}: {error}") from error
    logger.info(
        "created disk store %s: %d pages, %d bytes", path, block.num_slots, block.file_bytes
    )
    return OpenedFile(handle, block, block.file_bytes)
