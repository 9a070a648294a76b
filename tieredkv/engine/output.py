"""Turning sampled tokens into text deltas, and deciding when a request stops.

Stop rules, in order, for each new token:
  a stop token (the request's `stop_token_ids`, or EOS / end of turn unless `ignore_eos`), once
  `min_tokens` are out → STOP, the token's text is not emitted;
  a stop string appears in the text → STOP, the text is cut before it;
  `max_tokens` reached, or the sequence reached the context limit → LENGTH.
While a stop string could still be completing, the text that could be its beginning is held
back, so the concatenated deltas of a stream always equal the non-streamed content.
"""

from __future__ import annotations

from collections.abc import Sequence

from tieredkv.engine.protocol import FinishReason
from tieredkv.model.sampler import SamplingParams
from tieredkv.model.tokenizer import ChatTokenizer, IncrementalDecoder


class OutputProcessor:
    """One request's detokenizer and stop checker."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        max_total_len: int,
    ) -> None:
        self.params = params
        self.prompt_len = len(prompt_ids)
        self.max_total_len = max_total_len
        self._decoder = IncrementalDecoder(tokenizer, prompt_ids)
        self._eos_ids = frozenset() if params.ignore_eos else tokenizer.stop_token_ids
        self._stop_ids = self._eos_ids | params.stop_token_ids
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        self._text = ""  # decoded so far, not cut
        self._emitted = 0  # characters of _text already returned
        self.num_tokens = 0  # generated tokens, the stop token included

    def banned_tokens(self) -> frozenset[int]:
        """Stop tokens may not be sampled before `min_tokens` are out."""
        return self._stop_ids if self.num_tokens < self.params.min_tokens else frozenset()

    def append(self, token: int) -> tuple[str, FinishReason | None]:
        """Account for one sampled token; return (new text, finish reason or None)."""
        self.num_tokens += 1
        if token in self._stop_ids and self.num_tokens > self.params.min_tokens:
            return self._finish(FinishReason.STOP)
        self._text += self._decoder.feed([token])
        cut = self._find_stop_string()
        if cut is not None:
            self._text = self._text[:cut]
            return self._take(len(self._text)), FinishReason.STOP
        if (
            self.num_tokens >= self.params.max_tokens
            or self.prompt_len + self.num_tokens >= self.max_total_len
        ):
            return self._finish(FinishReason.LENGTH)
        return self._take(max(self._emitted, len(self._text) - self._hold)), None

    def _finish(self, reason: FinishReason) -> tuple[str, FinishReason]:
        self._text += self._decoder.flush()
        cut = self._find_stop_string()
        if cut is not None:
            self._text, reason = self._text[:cut], FinishReason.STOP
        return self._take(len(self._text)), reason

    def _find_stop_string(self) -> int | None:
        if not self.params.stop:
            return None
        # only text that is new, plus what a stop string could straddle, needs searching
        start = max(0, self._emitted - self._hold)
        hits = [i for s in self.params.stop if (i := self._text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _take(self, end: int) -> str:
        delta = self._text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return delta
