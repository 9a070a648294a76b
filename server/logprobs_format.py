"""OpenAI's two logprobs shapes, from the engine's `TokenLogprob`s.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}`,
one entry per generated token. Completions: parallel lists `tokens`, `token_logprobs`,
`top_logprobs` (a dict of token text -> logprob holding the top k and the chosen token, as
vLLM's) and `text_offset` (where each token's text starts in the choice's text); with `echo`
the prompt's tokens come first, the very first with null logprobs (nothing precedes it).

A token's text is its own decoding (special tokens included); a token that is part of a UTF-8
character decodes to U+FFFD, as in vLLM. JSON has no -inf: a logprob below -9999 reads -9999.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tieredkv.model.logprobs import TokenLogprob
from tieredkv.model.tokenizer import ChatTokenizer

LOGPROB_FLOOR = -9999.0


class TokenTexts:
    """Each token id's own text, decoded once per request."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text


def _finite(logprob: float) -> float:
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR  # NaN too: never in JSON


def _chat_token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(logprobs: Sequence[TokenLogprob], text_of: TokenTexts) -> dict[str, Any]:
    content = []
    for logprob in logprobs:
        entry = _chat_token(text_of(logprob.token_id), logprob.logprob)
        entry["top_logprobs"] = [_chat_token(text_of(i), value) for i, value in logprob.top]
        content.append(entry)
    return {"content": content, "refusal": None}


def completion_logprobs(
    token_ids: Sequence[int],
    logprobs: Sequence[TokenLogprob | None],
    text_of: TokenTexts,
    first_offset: int = 0,
) -> dict[str, Any]:
    """`token_ids[i]` scored by `logprobs[i]` (None: the prompt's first token)."""
    tokens, values, tops, offsets = [], [], [], []
    offset = first_offset
    for token_id, logprob in zip(token_ids, logprobs, strict=True):
        text = text_of(token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if logprob is None:
            values.append(None)
            tops.append(None)
            continue
        values.append(_finite(logprob.logprob))
        top = {text_of(i): _finite(value) for i, value in logprob.top}
        top.setdefault(text, _finite(logprob.logprob))
        tops.append(top)
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }
