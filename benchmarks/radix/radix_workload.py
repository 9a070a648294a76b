"""A synthetic multi-turn chat workload for the radix tree benchmark.

Many users talk to one assistant. Every prompt is the shared system prompt, the user's own
document, the conversation so far (questions and answers wrapped in chat-template tokens) and a
new question. A user's first prompt is 2.5k-2.9k tokens; each turn adds an answer and a
question; a user whose next prompt would pass 3.5k tokens leaves and a new user arrives.
`active_users` talk at once, in seeded random order, so the tree branches as in a server.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

USER_START, ASSISTANT_START, TURN_END = 1, 2, 3  # stand-ins for chat-template tokens


@dataclass(frozen=True)
class ChatTurn:
    """One request: `prompt` goes in, `output` comes out (its last token ends the turn)."""

    user: int
    prompt: list[int]
    output: list[int]


@dataclass(frozen=True)
class ChatShape:
    """Token counts of the workload (inclusive ranges, drawn uniformly)."""

    system_len: int = 600
    first_prompt: tuple[int, int] = (2600, 2900)  # minus a short question: >= 2.5k
    max_prompt: int = 3500
    question: tuple[int, int] = (20, 120)
    answer: tuple[int, int] = (60, 300)
    vocab: int = 49152  # the default model's


@dataclass
class _User:
    id: int
    history: list[int]  # everything said so far: the next prompt's prefix


class ChatWorkload:
    """An endless (or bounded) stream of chat turns from many users, reproducible by seed."""

    def __init__(self, seed: int, active_users: int = 64, shape: ChatShape | None = None) -> None:
        self.shape = shape or ChatShape()
        self.active_users = active_users
        self._rng = np.random.default_rng(seed)
        # one int object per token id, shared by every list: a big tree stays small in memory
        self._vocab = list(range(self.shape.vocab))
        self.system = self._tokens(self.shape.system_len)
        self.num_users = 0  # users started so far

    def _tokens(self, count: int) -> list[int]:
        ids = self._rng.integers(4, self.shape.vocab, count).tolist()
        return list(map(self._vocab.__getitem__, ids))

    def _draw(self, bounds: tuple[int, int]) -> int:
        return int(self._rng.integers(bounds[0], bounds[1] + 1))

    def _question(self) -> list[int]:
        return [
            USER_START,
            *self._tokens(self._draw(self.shape.question)),
            TURN_END,
            ASSISTANT_START,
        ]

    def _answer(self) -> list[int]:
        return [*self._tokens(self._draw(self.shape.answer) - 1), TURN_END]

    def _new_user(self) -> _User:
        self.num_users += 1
        first_len = self._draw(self.shape.first_prompt)
        question_room = self.shape.question[1] + 3
        document = self._tokens(first_len - self.shape.system_len - question_room)
        return _User(self.num_users - 1, [*self.system, *document])

    def _turn(self, user: _User) -> ChatTurn | None:
        prompt = [*user.history, *self._question()]
        if len(prompt) > self.shape.max_prompt:
            return None
        output = self._answer()
        user.history = prompt + output
        return ChatTurn(user.id, prompt, output)

    def turns(self, max_users: int | None = None) -> Iterator[ChatTurn]:
        """Turns in arrival order until `max_users` users have finished (None: forever)."""

        def more() -> bool:
            return max_users is None or self.num_users < max_users

        active = [self._new_user() for _ in range(self.active_users) if more()]
        while active:
            index = int(self._rng.integers(len(active)))
            turn = self._turn(active[index])
            if turn is not None:
                yield turn
            elif more():
                active[index] = self._new_user()
            else:
                active.pop(index)
