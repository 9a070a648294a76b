"""GGUF files: validation errors, the atomic one-time conversion, and the default model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash

from tieredkv.errors import ModelLoadError, UnsupportedModelError
from tieredkv.model import gguf_file
from tieredkv.model.default_model import DEFAULT_MODEL_NAME, default_gguf_path
from tieredkv.model.gguf_file import SOURCE_STAMP, convert_gguf
from tieredkv.model.loader import LoadedModel, load_model


def _head_of_default_gguf(tmp_path: Path, num_bytes: int) -> Path:
    path = tmp_path / "cut.gguf"
    with open(default_gguf_path(), "rb") as source:
        path.write_bytes(source.read(num_bytes))
    return path


@pytest.mark.parametrize("num_bytes", [1000, 4 << 20])
def test_truncated_gguf(tmp_path: Path, num_bytes: int) -> None:
    path = _head_of_default_gguf(tmp_path, num_bytes)
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert f"{path}: truncated or corrupt GGUF file" in str(info.value)


def test_corrupt_gguf(tmp_path: Path) -> None:
    path = tmp_path / "noise.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    with pytest.raises(ModelLoadError, match=r"noise.gguf: truncated or corrupt GGUF file"):
        load_model(path)
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_bytes(b"hello world, not a gguf at all")
    with pytest.raises(ModelLoadError, match=r"text.gguf: .*magic"):
        load_model(not_gguf)


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "tiny-gpt2.gguf"
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError) as info:
        load_model(tmp_path)  # a directory holding exactly one .gguf
    assert f"{path}: unsupported GGUF architecture 'gpt2'" in str(info.value)


def test_several_ggufs_in_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=r"several .gguf files \['a.gguf', 'b.gguf'\]"):
        load_model(tmp_path)


def _fake_source(tmp_path: Path) -> Path:
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF fake")
    return source


def test_conversion_crash_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(gguf_path: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"half a file")
        raise RuntimeError("simulated crash mid-conversion")

    monkeypatch.setattr(gguf_file, "check_gguf", lambda path: None)
    monkeypatch.setattr(gguf_file, "_write_safetensors_dir", crash)
    out = tmp_path / "cache" / "m"
    with pytest.raises(RuntimeError, match="simulated crash"):
        convert_gguf(_fake_source(tmp_path), out)
    assert not out.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == [".m.lock"]  # no temp dir left


def test_conversion_runs_once_and_again_when_the_source_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def write(gguf_path: Path, out: Path) -> None:
        calls.append(out)
        (out / "model.safetensors").write_bytes(b"%d" % len(calls))

    monkeypatch.setattr(gguf_file, "check_gguf", lambda path: None)
    monkeypatch.setattr(gguf_file, "_write_safetensors_dir", write)
    source, out = _fake_source(tmp_path), tmp_path / "cache" / "m"
    assert convert_gguf(source, out) == out
    assert convert_gguf(source, out) == out
    assert len(calls) == 1 and (out / "model.safetensors").read_bytes() == b"1"
    stamp = json.loads((out / SOURCE_STAMP).read_text())
    assert stamp["xxh3_128"] == xxhash.xxh3_128(source.read_bytes()).hexdigest()
    assert stamp["size"] == 9
    # another copy of the same file (another checkout, another venv), touched later: found
    copy = tmp_path / "elsewhere" / source.name
    copy.parent.mkdir()
    shutil.copyfile(source, copy)
    os.utime(copy, ns=(1, 1))
    assert convert_gguf(copy, out) == out and len(calls) == 1
    source.write_bytes(source.read_bytes()[::-1])  # the content changed: converted again
    convert_gguf(source, out)
    assert len(calls) == 2 and (out / "model.safetensors").read_bytes() == b"2"
    assert sorted(p.name for p in out.parent.iterdir()) == [".m.lock", "m"]


def test_default_model(default_dir: Path, default_model: LoadedModel) -> None:
    assert default_dir.name == DEFAULT_MODEL_NAME == default_model.name
    assert {p.name for p in default_dir.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        SOURCE_STAMP,
    }
    config = default_model.config
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (
        30,
        9,
        3,
        64,
    )
    assert config.tie_word_embeddings and "lm_head.weight" not in default_model.weights
    assert config.rope_theta == 100000.0 and config.vocab_size == 49152
    tokenizer = default_model.tokenizer
    assert tokenizer.eos_token_id == tokenizer.token_id("<|im_end|>")
    assert tokenizer.token_id("<|im_end|>") in tokenizer.stop_token_ids
    assert all(t.dtype == torch.float32 for t in default_model.weights.values())


def test_cached_weights_are_the_exact_dequantized_values(default_model: LoadedModel) -> None:
    import gguf

    reader = gguf.GGUFReader(default_gguf_path())
    tensors = {t.name: t for t in reader.tensors}
    for gguf_name, hf_name in [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
        ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
    ]:
        tensor = tensors[gguf_name]
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        expected = torch.from_numpy(np.array(values, dtype=np.float32))
        assert torch.equal(
            default_model.weights[hf_name],
            expected.reshape(-1).view_as(default_model.weights[hf_name]),
        ), hf_name


def test_later_loads_never_import_transformers(
    default_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load_model()` with no path finds the cached conversion: no transformers, no GGUF read."""
    monkeypatch.setenv("TIEREDKV_CACHE_DIR", str(default_dir.parent))
    code = (
        "import sys, torch\n"
        "from tieredkv.model.loader import load_model\n"
        "m = load_model(dtype=torch.bfloat16)\n"
        "assert 'transformers' not in sys.modules and 'gguf' not in sys.modules\n"
        "print(m.name, m.model_dir, m.weights['model.norm.weight'].dtype)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [DEFAULT_MODEL_NAME, str(default_dir), "torch.bfloat16"]


def test_the_default_gguf_path_loads_the_default_directory(
    default_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIEREDKV_CACHE_DIR", str(default_dir.parent))
    model = load_model(default_gguf_path())
    assert model.model_dir == default_dir and model.name == DEFAULT_MODEL_NAME


_KILLED_CONVERSION = """
import sys
from pathlib import Path
from tieredkv.model import gguf_file

def write_then_hang(gguf_path, out):
    (out / "model.safetensors").write_bytes(b"half a file")
    print("ready", flush=True)
    sys.stdin.read()  # blocks until the parent kills us

gguf_file.check_gguf = lambda path: None
gguf_file._write_safetensors_dir = write_then_hang
gguf_file.convert_gguf(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def test_conversion_killed_midway_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, out = _fake_source(tmp_path), tmp_path / "cache" / "m"
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CONVERSION, str(source), str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    finally:
        child.kill()  # SIGKILL: no cleanup handler runs
        child.wait(timeout=60)
    assert not out.exists()
    assert any(p.name.startswith(".m.tmp-") for p in out.parent.iterdir())  # the half dir

    def write(gguf_path: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"whole")

    monkeypatch.setattr(gguf_file, "check_gguf", lambda path: None)
    monkeypatch.setattr(gguf_file, "_write_safetensors_dir", write)
    convert_gguf(source, out)  # the dead process's lock is gone; its temp dir is cleaned up
    assert (out / "model.safetensors").read_bytes() == b"whole"
    assert sorted(p.name for p in out.parent.iterdir()) == [".m.lock", "m"]
