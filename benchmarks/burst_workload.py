"""The burst workload: groups of requests that share a long prefix, in a shuffled arrival order.

Two kinds. `fewshot`: each group is one few-shot template (instructions and example Q/A pairs
in the system message, ~`shared_words` words); each request asks its own question (~
`question_words` words of context, then a question). `rag`: one short system prompt common to
all; each group is one document, and the user message is the group's document followed by a
request's query. Text comes from `workload.prose` seeded by (seed, kind, purpose, group, index):
the same config gives byte-identical requests on any machine. The arrival order is a seeded
shuffle, the same for every policy, so arrival does not group requests by their prefix.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from tieredkv.bench.workload import prose, random_question
from tieredkv.errors import ConfigError

KINDS = ("fewshot", "rag")
ANSWER_WORDS = 60  # one few-shot example's answer
RAG_SYSTEM = (
    "You are a careful assistant. Answer the user's query from the document they give, briefly "
    "and only from its content."
)


@dataclasses.dataclass(frozen=True)
class BurstConfig:
    """`groups` shared prefixes x `per_group` requests each; sizes in words (~1.3 tokens)."""

    kind: str = "fewshot"
    groups: int = 8
    per_group: int = 8
    shared_words: int = 950
    question_words: int = 60
    max_tokens: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"BurstConfig.kind must be one of {KINDS}, got {self.kind!r}")
        for name in ("groups", "per_group", "shared_words", "max_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"BurstConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.question_words < 0:
            raise ConfigError(f"BurstConfig.question_words must be >= 0, got {self.question_words}")

    @property
    def num_requests(self) -> int:
        return self.groups * self.per_group


@dataclasses.dataclass(frozen=True)
class BurstRequest:
    """One request: its group (shared prefix), its index in the group and its chat messages."""

    group: int
    index: int
    messages: list[dict[str, str]]


def _rng(config: BurstConfig, *purpose: object) -> random.Random:
    return random.Random("/".join(str(p) for p in (config.seed, config.kind, *purpose)))


def fewshot_template(config: BurstConfig, group: int) -> str:
    """Instructions, then example Q/A pairs until the template has `shared_words` words."""
    rng = _rng(config, "template", group)
    parts = [
        f"You are assistant number {group} of a logistics company. Answer each question in the "
        "style of the examples below: one short paragraph, facts only.\n\nExamples:"
    ]
    words = len(parts[0].split())
    while words < config.shared_words:
        question = random_question(rng)
        example = f"Q: {question}\nA: {prose(rng, ANSWER_WORDS)}"
        parts.append(example)
        words += len(example.split())
    return "\n\n".join(parts)


def document(config: BurstConfig, group: int) -> str:
    """The rag group's shared document (~`shared_words` words)."""
    return prose(_rng(config, "document", group), config.shared_words)


def question(config: BurstConfig, group: int, index: int) -> str:
    """~`question_words` words of context, then one question."""
    rng = _rng(config, "question", group, index)
    asked = random_question(rng)
    if config.question_words == 0:
        return asked
    return f"{prose(rng, config.question_words)}\n\n{asked}"


def messages(config: BurstConfig, group: int, index: int) -> list[dict[str, str]]:
    if config.kind == "fewshot":
        system, user = fewshot_template(config, group), f"Q: {question(config, group, index)}"
    else:
        system = RAG_SYSTEM
        user = f"Document:\n\n{document(config, group)}\n\nQuery: {question(config, group, index)}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def arrival_order(config: BurstConfig) -> list[BurstRequest]:
    """Every request, in the seeded shuffled order they arrive in (the same for every run)."""
    requests = [
        BurstRequest(group, index, messages(config, group, index))
        for group in range(config.groups)
        for index in range(config.per_group)
    ]
    _rng(config, "arrival").shuffle(requests)
    return requests


def grouped_order(requests: list[BurstRequest]) -> list[BurstRequest]:
    """The reference offline order: by group, then index."""
    return sorted(requests, key=lambda r: (r.group, r.index))


def _common_prefix(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def shared_prefix_tokens(
    requests: list[BurstRequest], token_ids: Callable[[list[dict]], list[int]], page_size: int
) -> dict[tuple[int, int], int]:
    """Per request (group, index): the most prompt tokens it shares with another request of its
    group, in whole pages and leaving one token to compute: the most a cache can reuse for it,
    counted by the client from its own prompts (`token_ids`: the chat template's ids)."""
    ids = {(r.group, r.index): token_ids(r.messages) for r in requests}
    shared = {}
    for key, mine in ids.items():
        others = [other for k, other in ids.items() if k[0] == key[0] and k != key]
        tokens = min(max((_common_prefix(mine, o) for o in others), default=0), len(mine) - 1)
        shared[key] = tokens // page_size * page_size
    return shared


def reusable_tokens(shared: dict[tuple[int, int], int]) -> int:
    """What a run can reuse at best: every request's shared tokens but for one request a group
    (the first to run computes its prefix; the largest share is the most it can cost)."""
    by_group: dict[int, list[int]] = {}
    for (group, _index), tokens in shared.items():
        by_group.setdefault(group, []).append(tokens)
    return sum(sum(tokens) - max(tokens) for tokens in by_group.values())
