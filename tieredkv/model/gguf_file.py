"""Convert a GGUF file, once, into a cached fp32 safetensors directory.

transformers + gguf dequantize the file (seconds to minutes); the result (config.json,
model.safetensors, tokenizer files, a source stamp) is written to a temporary directory and
renamed into place, so a crash mid-conversion never leaves a half directory. Later loads read
the directory and never instantiate a transformers model. The weights stay fp32: dequantized
values do not survive a round trip through bf16.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import xxhash

from tieredkv.errors import ModelLoadError, UnsupportedModelError

log = logging.getLogger(__name__)

SOURCE_STAMP = "tieredkv-source.json"
_CONVERTER_VERSION = 1  # bump to reconvert every cached directory
STAMP_CHUNK_BYTES = 16 << 20  # hashing the source (about 100 MB for the default model)
# GGUF `general.architecture` values whose conversion by transformers gives a complete config
# (its GGUF reader drops Gemma 3's query_pre_attn_scalar and RoPE scaling: not gemma3)
GGUF_ARCHITECTURES = ("llama", "qwen2", "mistral", "qwen3")


def gguf_cache_dir(gguf_path: Path, root: Path) -> Path:
    """Where a user's GGUF file is converted: keyed by its absolute path, named by its stem."""
    key = hashlib.blake2b(str(gguf_path.resolve()).encode(), digest_size=6).hexdigest()
    return root / "gguf" / key / gguf_path.stem


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """`out_dir`, converted from `gguf_path` unless it already holds the conversion of a file
    with the same content (and converter version). Concurrent callers convert once: they take
    an exclusive lock beside `out_dir`."""
    stamp = _source_stamp(gguf_path)
    if _stamp_matches(out_dir, stamp):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # SYNC: another process may be converting this file
        if not _stamp_matches(out_dir, stamp):
            _remove_leftovers(out_dir)
            check_gguf(gguf_path)
            _convert_atomically(gguf_path, out_dir, stamp)
    return out_dir


def check_gguf(path: Path) -> None:
    """ModelLoadError if `path` is not a complete GGUF file; UnsupportedModelError if its
    architecture is not one tieredkv serves."""
    import gguf  # lazy: only conversion needs it

    try:
        reader = gguf.GGUFReader(path)
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode()
        end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    except (ValueError, IndexError, KeyError, OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: truncated or corrupt GGUF file ({exc})") from exc
    if end > path.stat().st_size:
        raise ModelLoadError(
            f"{path}: truncated GGUF file (tensor data ends at byte {end}, "
            f"the file has {path.stat().st_size})"
        )
    if architecture not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: unsupported GGUF architecture {architecture!r}; "
            f"tieredkv reads GGUF files of {', '.join(GGUF_ARCHITECTURES)} "
            "(other models: their safetensors directory)"
        )


def _source_stamp(gguf_path: Path) -> dict[str, object]:
    """What the conversion is a function of: the file's bytes (by digest, so another copy of
    the same file, in another checkout or venv, finds the conversion) and the converter."""
    digest = xxhash.xxh3_128()
    with open(gguf_path, "rb") as source:
        while chunk := source.read(STAMP_CHUNK_BYTES):
            digest.update(chunk)
    return {
        "xxh3_128": digest.hexdigest(),
        "size": gguf_path.stat().st_size,
        "converter_version": _CONVERTER_VERSION,
    }


def _stamp_matches(out_dir: Path, stamp: dict[str, object]) -> bool:
    try:
        return json.loads((out_dir / SOURCE_STAMP).read_text()) == stamp
    except (OSError, ValueError):
        return False


def _convert_atomically(gguf_path: Path, out_dir: Path, stamp: dict[str, object]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is as readable as any other
    try:
        log.info("converting %s to %s (once)", gguf_path, out_dir)
        _write_safetensors_dir(gguf_path, tmp)
        (tmp / SOURCE_STAMP).write_text(json.dumps(stamp, indent=2))
        for path in tmp.iterdir():
            path.chmod(0o644)  # some writers create private files; the cache is not secret
            _fsync(path)
        if out_dir.exists():  # a stale conversion: move it aside, then swap the new one in
            stale = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.rename(out_dir, stale / "dir")
            os.rename(tmp, out_dir)
            shutil.rmtree(stale, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
        _fsync(out_dir.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_leftovers(out_dir: Path) -> None:
    """Temp dirs of conversions killed midway (we hold the lock: nobody else is converting)."""
    for pattern in (f".{out_dir.name}.tmp-*", f".{out_dir.name}.old-*"):
        for leftover in out_dir.parent.glob(pattern):
            log.info("removing %s, left by an interrupted conversion", leftover)
            shutil.rmtree(leftover, ignore_errors=True)


def _write_safetensors_dir(gguf_path: Path, out: Path) -> None:
    """Dequantize with transformers and write config.json, model.safetensors, tokenizer files."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = gguf_path.parent, gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"{gguf_path}: transformers could not read this GGUF ({exc})") from exc
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # one storage, saved once
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the weights are plain fp32 now
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
