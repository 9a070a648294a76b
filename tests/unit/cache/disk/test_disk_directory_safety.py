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


def test_a_symlinked_directory_is_refused_without_following_it(tmp_path: Path) -> None:
    target = tmp_path / "private"
    target.mkdir(mode=0o700)
    link = tmp_path / "kv"
    link.symlink_to(target)
    with pytest.raises(DiskStoreError, match="is a symlink"):
        open_store(link)
    assert list(target.iterdir()) == []  # nothing was created through the link


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757])
def test_a_directory_under_a_parent_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, mode)
    directory = parent / "kv"
    directory.mkdir(mode=0o700)
    with pytest.raises(DiskStoreError, match=f"under {parent}, which group or others may write"):
        open_store(directory)
    assert not (directory / STORE_FILE).exists()
    with pytest.raises(DiskStoreError, match=f"under {parent}"):
        open_store(parent / "deeper" / "kv")  # refused before it is created
    assert not (parent / "deeper").exists()


def test_an_open_directory_higher_up_the_chain_is_refused(tmp_path: Path) -> None:
    top = tmp_path / "open"
    top.mkdir()
    os.chmod(top, 0o777)
    middle = top / "private"
    middle.mkdir(mode=0o700)
    with pytest.raises(DiskStoreError, match=f"under {top}"):
        open_store(middle / "kv")


def test_a_symlinked_parent_is_checked_where_it_points(tmp_path: Path) -> None:
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    os.chmod(open_parent, 0o777)
    (tmp_path / "alias").symlink_to(open_parent)
    with pytest.raises(DiskStoreError, match=f"under {open_parent}"):
        open_store(tmp_path / "alias" / "kv")


def test_a_sticky_world_writable_parent_is_accepted(tmp_path: Path) -> None:
    parent = tmp_path / "like-tmp"
    parent.mkdir()
    os.chmod(parent, 0o1777)
    store = open_store(parent / "kv")  # the owner alone may rename or remove kv in a sticky dir
    store.close()
    assert (parent / "kv" / STORE_FILE).is_file()
