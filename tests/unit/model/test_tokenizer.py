"""ChatTokenizer against transformers' tokenizer; stop tokens; streaming detokenization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.model_factory import make_tiny_model_dir
from tieredkv.errors import ModelLoadError, RequestError
from tieredkv.model.tokenizer import ChatTokenizer, IncrementalDecoder

TEXTS = [
    "Hello world!",
    "  leading spaces\n\ttabs and trailing  ",
    "héllo 世界 🎉 emoji, ünïcödé",
    "<|im_start|>user\nhi<|im_end|>",
    "",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3? 🎲"},
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tok"))


def _parity(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(model_dir)
    ours = ChatTokenizer(model_dir)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == reference(text)["input_ids"], text
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids)
    for add_prompt in (True, False):
        expected = reference.apply_chat_template(
            MESSAGES, add_generation_prompt=add_prompt, tokenize=True
        )["input_ids"]
        assert ours.apply_chat_template(MESSAGES, add_prompt) == expected
    assert ours.vocab_size == len(reference)


def test_default_tokenizer_matches_transformers(default_dir: Path) -> None:
    _parity(default_dir)


def test_tiny_tokenizer_matches_transformers(tiny_dir: Path) -> None:
    _parity(tiny_dir)


def test_default_chat_template_and_stop_tokens(default_dir: Path) -> None:
    tokenizer = ChatTokenizer(default_dir)
    text = tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")  # the template's default system prompt
    im_end = tokenizer.token_id("<|im_end|>")
    assert im_end is not None and im_end in tokenizer.stop_token_ids
    assert tokenizer.eos_token_id in tokenizer.stop_token_ids
    assert tokenizer.vocab_size == 49152 and len(tokenizer.files_digest) == 16


def test_end_of_turn_tokens_and_generation_config_join_stop_ids(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    (model_dir / "tokenizer_config.json").write_text(
        json.dumps({**config, "eos_token": {"content": "<|endoftext|>"}})  # AddedToken form
    )
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 7]}))
    tokenizer = ChatTokenizer(model_dir)
    assert tokenizer.eos_token_id == 0
    assert tokenizer.stop_token_ids == frozenset({0, 2, 7})  # eos, <|im_end|>, generation config


def test_content_parts_are_joined(tiny_dir: Path) -> None:
    tokenizer = ChatTokenizer(tiny_dir)
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert tokenizer.render_chat(parts) == tokenizer.render_chat(
        [{"role": "user", "content": "a\nb"}]
    )
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(RequestError, match="only text content parts"):
        tokenizer.render_chat(image)


def test_template_errors_are_request_errors(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    (model_dir / "chat_template.jinja").write_text(strict + config["chat_template"])
    tokenizer = ChatTokenizer(model_dir)  # chat_template.jinja wins over tokenizer_config
    with pytest.raises(RequestError, match="user first"):
        tokenizer.apply_chat_template([{"role": "assistant", "content": "x"}])
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}])
    (model_dir / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(
        ModelLoadError, match=r"chat_template.jinja: chat template does not compile"
    ):
        ChatTokenizer(model_dir)


def test_no_chat_template(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = ChatTokenizer(model_dir)
    assert tokenizer.chat_template is None and tokenizer.stop_token_ids == frozenset({2})
    with pytest.raises(RequestError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


def test_corrupt_tokenizer_file(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    (model_dir / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(ModelLoadError, match=r"tokenizer.json: not a valid tokenizer file"):
        ChatTokenizer(model_dir)


def _stream(tokenizer: ChatTokenizer, ids: list[int], prompt: list[int]) -> list[str]:
    decoder = IncrementalDecoder(tokenizer, prompt_ids=prompt)
    deltas = [decoder.feed([token]) for token in ids]
    return [*deltas, decoder.flush()]


@pytest.mark.parametrize("which", ["default", "tiny"])
def test_incremental_decoder(which: str, default_dir: Path, tiny_dir: Path) -> None:
    tokenizer = ChatTokenizer(default_dir if which == "default" else tiny_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    text = "héllo 世界 🎉🎲 ok.  Two  spaces, and ünïcödé<|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = _stream(tokenizer, ids, prompt)
    assert "".join(deltas) == tokenizer.decode(ids) == text.removesuffix("<|im_end|>")
    assert all("\ufffd" not in delta for delta in deltas)  # never half a character
    assert any(delta == "" for delta in deltas)  # multi-byte characters were held back


def test_incremental_decoder_flushes_an_incomplete_tail(default_dir: Path) -> None:
    tokenizer = ChatTokenizer(default_dir)
    ids = tokenizer.encode("ok 🎉", add_special_tokens=False)
    cut = ids[:-1]  # the emoji's last byte never arrives
    decoder = IncrementalDecoder(tokenizer)
    streamed = decoder.feed(cut)
    assert "\ufffd" not in streamed
    assert streamed + decoder.flush() == tokenizer.decode(cut)
    assert tokenizer.decode(cut).endswith("\ufffd")
