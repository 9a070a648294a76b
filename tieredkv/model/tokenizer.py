"""The tokenizer and chat template of a model directory, on `tokenizers` + Jinja alone.

Reads `tokenizer.json`, `tokenizer_config.json` (special tokens, chat template),
`chat_template.jinja` and `generation_config.json` (extra EOS ids). Importing transformers takes
seconds; serving never needs it. Streaming detokenization is `IncrementalDecoder`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xxhash
from tokenizers import Tokenizer

from tieredkv.errors import ModelLoadError, RequestError
from tieredkv.model.chat_template import ChatTemplate

# Files whose bytes decide how text becomes tokens; all are part of the model fingerprint.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)
# End-of-turn markers of common chat templates; a stop token when the template uses it.
_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ChatTokenizer:
    """Text <-> token ids for one model, plus its chat template and stop tokens.

    `stop_token_ids` holds the EOS id, generation_config's EOS ids and the end-of-turn token(s)
    the chat template emits (e.g. <|im_end|>, <|eot_id|>). `files_digest` is an xxh3_128 over
    the tokenizer files, for the model fingerprint.
    """

    def __init__(self, model_dir: Path) -> None:
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{path}: tokenizer.json not found in the model directory")
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on a bad file
            raise ModelLoadError(f"{path}: not a valid tokenizer file ({exc})") from exc
        config = _read_json(model_dir / "tokenizer_config.json")
        special = {k: _token_text(config.get(k)) for k in _SPECIAL_TOKEN_KEYS}
        self.special_tokens = {k: v for k, v in special.items() if v is not None}
        self.vocab_size: int = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_token_id: int = self._eos_id(model_dir)
        self.chat_template = _load_template(model_dir, config, self.special_tokens)
        self.stop_token_ids: frozenset[int] = self._stop_ids(model_dir)
        self.files_digest: bytes = _files_digest(model_dir)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, with the tokenizer's own BOS/EOS additions (as `tokenizer(text)`
        in transformers) unless `add_special_tokens` is False."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids`; special tokens (EOS, end-of-turn) are dropped by default."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Prompt ids for an OpenAI-style message list, as transformers'
        `apply_chat_template(tokenize=True)`: render, then encode without special tokens (the
        template writes them). RequestError when there is no template or it refuses."""
        return self.encode(self.render_chat(messages, add_generation_prompt), False)

    def render_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """The chat template's text for `messages` (what `apply_chat_template` tokenizes)."""
        if self.chat_template is None:
            raise RequestError("this model has no chat template; use /v1/completions")
        return self.chat_template.render(messages, add_generation_prompt)

    def token_id(self, token: str) -> int | None:
        """The id of a vocabulary entry, or None."""
        return self._tokenizer.token_to_id(token)

    def _eos_id(self, model_dir: Path) -> int:
        eos = self.special_tokens.get("eos_token")
        eos_id = self.token_id(eos) if eos is not None else None
        if eos_id is None:
            ids = _generation_eos_ids(model_dir)
            eos_id = ids[0] if ids else None
        if eos_id is None:
            raise ModelLoadError(f"{model_dir}: no eos_token in tokenizer_config.json")
        return eos_id

    def _stop_ids(self, model_dir: Path) -> frozenset[int]:
        ids = {self.eos_token_id, *_generation_eos_ids(model_dir)}
        template = self.chat_template.text if self.chat_template else ""
        for token in _END_OF_TURN_TOKENS:
            token_id = self.token_id(token)
            if token in template and token_id is not None:
                ids.add(token_id)
        return frozenset(ids)


class IncrementalDecoder:
    """Streaming detokenization: feed generated ids, get only the new text.

    Never emits half a UTF-8 character: while the newest tokens decode to a trailing U+FFFD
    (an incomplete byte sequence) their text is held back. Each step decodes only a short window
    (the last emitted tokens as context plus the new ones), so SentencePiece's leading-space
    rule and byte-level merges come out as in a full decode. `flush()` at the end emits whatever
    is held back, so the concatenated deltas equal `decode(all generated ids)` in practice.
    """

    _CONTEXT_TOKENS = 5

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(prompt_ids[-self._CONTEXT_TOKENS :])
        self._prefix_offset = 0  # window start: context for the leading-space rule
        self._read_offset = len(self._ids)  # tokens before this are already emitted

    def feed(self, ids: Sequence[int]) -> str:
        """Append `ids` (possibly empty) and return the newly complete text (possibly "")."""
        self._ids.extend(ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Emit any held-back text, even if it ends in an incomplete character."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        decode = self._tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset : self._read_offset], self._skip)
        text = decode(self._ids[self._prefix_offset :], self._skip)
        if len(text) <= len(prefix) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return text[len(prefix) :]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: not a valid JSON file ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _generation_eos_ids(model_dir: Path) -> list[int]:
    value = _read_json(model_dir / "generation_config.json").get("eos_token_id")
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int)]


def _load_template(
    model_dir: Path, config: dict[str, Any], special_tokens: dict[str, str]
) -> ChatTemplate | None:
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return ChatTemplate(jinja_file.read_text(encoding="utf-8"), str(jinja_file), special_tokens)
    text = config.get("chat_template")
    if isinstance(text, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in text if isinstance(t, dict)}
        text = named.get("default")
    if not isinstance(text, str):
        return None
    return ChatTemplate(text, str(model_dir / "tokenizer_config.json"), special_tokens)


def _files_digest(model_dir: Path) -> bytes:
    digest = xxhash.xxh3_128()
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            data = path.read_bytes()
            digest.update(f"{name}:{len(data)}:".encode())
            digest.update(data)
    return digest.digest()
