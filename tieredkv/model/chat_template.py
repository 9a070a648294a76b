"""Render a model's Jinja chat template the way transformers does, without importing it.

Same environment as `transformers` (sandboxed, trim_blocks, lstrip_blocks, loop controls,
`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII), so the rendered text, and
therefore the prompt tokens, are identical to `tokenizer.apply_chat_template`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tieredkv.errors import ModelLoadError, RequestError


def _raise_exception(message: str) -> None:
    raise RequestError(f"chat template refused the conversation: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class ChatTemplate:
    """A compiled chat template; `source` names where it came from, for error messages."""

    def __init__(self, text: str, source: str, special_tokens: Mapping[str, str]) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(text)
        except jinja2.TemplateError as exc:
            raise ModelLoadError(f"{source}: chat template does not compile ({exc})") from exc
        self.text = text
        self._special_tokens = dict(special_tokens)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The prompt text for `messages`. Content given as a list of text parts is joined, so
        every template sees plain strings. A template error is a RequestError (HTTP 400)."""
        try:
            return self._template.render(
                messages=[_flatten_content(message) for message in messages],
                add_generation_prompt=add_generation_prompt,
                tools=None,
                documents=None,
                **self._special_tokens,
            )
        except RequestError:
            raise
        except (jinja2.TemplateError, TypeError, KeyError, ValueError) as exc:
            raise RequestError(f"chat template failed on these messages: {exc}") from exc


def _flatten_content(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            raise RequestError("only text content parts are supported", param="messages")
        texts.append(str(part.get("text", "")))
    return {**message, "content": "\n".join(texts)}  # as vLLM joins text parts
