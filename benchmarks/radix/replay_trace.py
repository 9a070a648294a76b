"""The seeded chat trace that benchmarks/radix_vs_sglang.py replays through both trees.

Its own generator (nothing from tieredkv's workload code): `users` x `rounds`; a 300-token
system prompt all users share, then per user a 2.2k-2.35k-token first message; each later round
appends the previous answer (40-80 tokens) and a new message (20-50): prompts of 2.5k-3.4k
tokens. Each round takes the users in a new shuffled order, one request at a time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

PAGE_SIZE = 16
CHUNK_TOKENS = 2048  # EngineConfig.max_batch_tokens: prefill inserts at chunk ends
VOCAB = 49152
OPS = ("match", "insert", "evict")  # the timed calls, on both trees

Samples = dict[str, list[int]]  # op -> nanoseconds per call


@dataclass(frozen=True)
class Turn:
    user: int
    round: int
    prompt: list[int]
    output: list[int]


def make_trace(seed: int, users: int, rounds: int) -> list[Turn]:
    """The chat trace, in arrival order."""
    rng = random.Random(seed)

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(rng.randint(low, high))]

    system = tokens(300, 300)
    history = {user: system + tokens(2200, 2350) for user in range(users)}
    turns = []
    for round_index in range(rounds):
        order = list(range(users))
        rng.shuffle(order)
        for user in order:
            output = tokens(40, 80)
            turns.append(Turn(user, round_index, list(history[user]), output))
            history[user] += output + tokens(20, 50)
    return turns
