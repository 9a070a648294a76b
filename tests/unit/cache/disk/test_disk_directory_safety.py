"""The disk directory is refused when another user could write into it, and nothing in it is
opened through a symlink: whoever can write there could plant records that pass the checksum."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.cache.disk.disk_cases import chain, open_store, random_pages, same_bytes
from tieredkv.cache.disk.directory import LOCK_FILE, STORE_FILE
from tieredkv.errors import DiskStoreError


def test_a_private_directory_is_created_and_reopened(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    store = open_store(directory)
    slots = store.alloc(2)
    pages = random_pages(2)
    store.write_pages(slots, chain(2), pages)
    store.close()
    assert directory.stat().st_mode & 0o777 == 0o700
    reopened = open_store(directory)
    assert [slot for slot, _ in reopened.scan()] == slots
    back = random_pages(2, seed=9)
    assert reopened.read_pages(slots, chain(2), back) == [True, True]
    assert same_bytes(back, pages)
    reopened.close()


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o720])
def test_a_group_or_world_writable_directory_is_refused(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "kv"
    directory.mkdir()
    os.chmod(directory, mode)
    with pytest.raises(DiskStoreError, match="group- or world-writable"):
        open_store(directory)
    assert not (directory / STORE_FILE).exists()  # refused before anything was written


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    directory.mkdir(mode=0o700)
    os.chown(directory, 4242, 4242)
    with pytest.raises(DiskStoreError, match="owned by uid 4242"):
        open_store(directory)


def test_a_store_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    directory.mkdir(mode=0o700)
    elsewhere = tmp_path / "planted.tkv"
    elsewhere.write_bytes(b"\0" * 8192)
    (directory / STORE_FILE).symlink_to(elsewhere)
    with pytest.raises(DiskStoreError, match=STORE_FILE):
        open_store(directory)
    assert elsewhere.read_bytes() == b"\0" * 8192  # the target was never written


def test_a_lock_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    directory.mkdir(mode=0o700)
    target = tmp_path / "somewhere-else"
    (directory / LOCK_FILE).symlink_to(target)
    with pytest.raises(DiskStoreError, match="lock"):
        open_store(directory)
    assert not target.exists()  # O_NOFOLLOW: nothing created through the link
