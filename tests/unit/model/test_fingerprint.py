"""The weights digest and the model fingerprint: what changes it and what does not."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
import xxhash

from tests.model_factory import make_tiny_model_dir
from tieredkv.cache.page_layout import PageLayout
from tieredkv.model import fingerprint
from tieredkv.model.fingerprint import file_digest_uncached, model_fingerprint, weights_digest
from tieredkv.model.loader import load_model


def _expected_weights_digest(files: list[Path]) -> bytes:
    """The documented formula, computed here from the raw bytes: xxh3_128 over each file's
    name, size and the xxh3_128 of its content."""
    digest = xxhash.xxh3_128()
    for path in files:
        data = path.read_bytes()
        digest.update(f"{path.name}:{len(data)}:".encode())
        digest.update(xxhash.xxh3_128(data).digest())
    return digest.digest()


def _layout(model: object, page_size: int = 16, dtype: torch.dtype = torch.float32) -> PageLayout:
    return PageLayout.for_model(model.config, page_size, dtype)  # type: ignore[attr-defined]


def test_file_digest_is_xxh3_128_of_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    data = bytes(range(256)) * 70_000  # 17.9 MB: more than one 16 MiB chunk
    path.write_bytes(data)
    assert file_digest_uncached(path) == xxhash.xxh3_128(data).digest()


def test_weights_digest_is_cached_by_size_and_mtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"a" * 1000)
    hashed: list[Path] = []
    real = fingerprint.file_digest_uncached
    monkeypatch.setattr(fingerprint, "file_digest_uncached", lambda p: hashed.append(p) or real(p))
    first = weights_digest([path])
    assert first == _expected_weights_digest([path])
    assert weights_digest([path]) == first and hashed == [path]  # second call: from the cache
    assert len(list((private_cache / "digests").iterdir())) == 1
    path.write_bytes(b"b" * 1000)  # same size, new mtime and content
    assert weights_digest([path]) == _expected_weights_digest([path]) and len(hashed) == 2
    assert _expected_weights_digest([path]) != first


def test_weights_digest_without_a_writable_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    monkeypatch.setenv("TIEREDKV_CACHE_DIR", str(blocker))
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"abc")
    other = tmp_path / "x.safetensors"
    other.write_bytes(b"defg")
    hashed: list[Path] = []
    real = fingerprint.file_digest_uncached
    monkeypatch.setattr(fingerprint, "file_digest_uncached", lambda p: hashed.append(p) or real(p))
    expected = _expected_weights_digest([path, other])
    assert weights_digest([path, other]) == expected
    assert weights_digest([path, other]) == expected
    assert hashed == [path, other] * 2  # nothing could be cached, so both calls hash
    assert weights_digest([other, path]) != expected  # the order is part of the digest


def test_fingerprint_covers_weights_tokenizer_dtype_and_layout(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    model = load_model(model_dir)
    base = model_fingerprint(model, _layout(model))
    assert len(base) == 16
    assert model_fingerprint(load_model(model_dir), _layout(model)) == base  # stable
    assert model_fingerprint(model, _layout(model, page_size=32)) != base
    assert model_fingerprint(model, _layout(model, dtype=torch.bfloat16)) != base
    bf16 = load_model(model_dir, dtype=torch.bfloat16)
    assert model_fingerprint(bf16, _layout(model)) != base  # weight dtype

    other = make_tiny_model_dir(tmp_path, seed=1, name="other-seed")
    assert model_fingerprint(load_model(other), _layout(model)) != base

    edited = tmp_path / "edited-template"
    shutil.copytree(model_dir, edited)
    config = (edited / "tokenizer_config.json").read_text()
    (edited / "tokenizer_config.json").write_text(config.replace("assistant", "model"))
    edited_model = load_model(edited)
    assert edited_model.weights_digest == model.weights_digest
    assert model_fingerprint(edited_model, _layout(model)) != base

    theta = dataclasses.replace(model, config=dataclasses.replace(model.config, rope_theta=1.0))
    assert model_fingerprint(theta, _layout(model)) != base  # architecture settings


def test_weight_bytes_change_the_digest(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    before = load_model(model_dir).weights_digest
    path = model_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last byte of the last tensor
    path.write_bytes(bytes(data))
    assert load_model(model_dir).weights_digest != before
