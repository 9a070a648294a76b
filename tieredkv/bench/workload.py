"""The multi-turn chat workload: deterministic, realistic text from a seed (no downloads).

Every user shares one system prompt, has a private document, and then asks one question per
round; round r's prompt is the whole conversation so far, with the model's *actual* previous
answers as the assistant turns (so a server's cache sees exactly what a chat client would send).
Text comes from a small English vocabulary and sentence templates drawn with `random.Random`
seeded by (seed, purpose, user, round): the same seed gives byte-identical text on any machine.
"""

from __future__ import annotations

import dataclasses
import random

from tieredkv.errors import ConfigError

NOUNS = (
    "report", "customer", "shipment", "budget", "contract", "server", "invoice", "warehouse",
    "schedule", "network", "supplier", "quarter", "audit", "policy", "engineer", "manager",
    "forecast", "project", "river", "bridge", "harbor", "factory", "committee", "survey",
    "license", "account", "region", "market", "product", "battery", "turbine", "pipeline",
    "library", "archive", "satellite", "vaccine", "harvest", "council", "reactor", "museum",
)  # fmt: skip
VERBS = (
    "approved", "delayed", "reviewed", "replaced", "measured", "reported", "reduced",
    "expanded", "inspected", "delivered", "rejected", "updated", "financed", "tested",
    "closed", "moved", "doubled", "audited", "recorded", "planned",
)  # fmt: skip
ADJECTIVES = (
    "annual", "northern", "new", "final", "regional", "early", "main", "second", "small",
    "large", "quiet", "urgent", "revised", "public", "private", "local", "central", "late",
)  # fmt: skip
PLACES = ("Lisbon", "Oslo", "Denver", "Nairobi", "Osaka", "Lima", "Perth", "Tallinn", "Quebec")
MONTHS = ("January", "March", "April", "June", "August", "October", "November", "December")
TEMPLATES = (
    "The {adj} {noun} was {verb} by the {noun2} in {month}.",
    "In {place}, the {noun} team {verb} the {adj} {noun2} after {num} weeks.",
    "According to the {noun}, {num} units of the {adj} {noun2} were {verb} last year.",
    "The {noun2} {verb} the {noun} because the {adj} {noun3} was not ready.",
    "By {month}, the {adj} {noun} in {place} had been {verb} twice.",
    "Costs for the {noun} rose by {num} percent once the {noun2} was {verb}.",
    "Nobody expected the {adj} {noun} to be {verb} before the {noun2} in {place}.",
)
QUESTIONS = (
    "What does the document say about the {noun}?",
    "Why was the {adj} {noun} {verb}?",
    "Summarize what happened in {place} in one sentence.",
    "Which {noun} is mentioned most often, and why does it matter?",
    "What changed for the {noun2} after {month}?",
    "List two facts about the {adj} {noun}.",
)


def _fields(rng: random.Random) -> dict[str, str]:
    return {
        "adj": rng.choice(ADJECTIVES),
        "noun": rng.choice(NOUNS),
        "noun2": rng.choice(NOUNS),
        "noun3": rng.choice(NOUNS),
        "verb": rng.choice(VERBS),
        "place": rng.choice(PLACES),
        "month": rng.choice(MONTHS),
        "num": str(rng.randint(2, 90)),
    }


def random_question(rng: random.Random) -> str:
    """One question about a document, drawn from `rng`."""
    return rng.choice(QUESTIONS).format(**_fields(rng))


def prose(rng: random.Random, num_words: int, sentences_per_paragraph: int = 6) -> str:
    """At least `num_words` words of paragraphs of template sentences drawn from `rng`."""
    paragraphs: list[str] = []
    sentences: list[str] = []
    words = 0
    while words < num_words:
        sentence = rng.choice(TEMPLATES).format(**_fields(rng))
        sentences.append(sentence)
        words += len(sentence.split())
        if len(sentences) == sentences_per_paragraph:
            paragraphs.append(" ".join(sentences))
            sentences = []
    if sentences:
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)


@dataclasses.dataclass(frozen=True)
class WorkloadConfig:
    """The shape of the workload: sizes in words (about 1.3 tokens each for Llama tokenizers)."""

    num_users: int = 8
    num_rounds: int = 3
    system_words: int = 150
    document_words: int = 2000
    max_tokens: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_users", "num_rounds", "max_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"WorkloadConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("system_words", "document_words"):
            if getattr(self, name) < 0:
                raise ConfigError(f"WorkloadConfig.{name} must be >= 0, got {getattr(self, name)}")


class Workload:
    """The texts of every user's conversation; `messages(user, answers)` builds the next prompt."""

    def __init__(self, config: WorkloadConfig) -> None:
        self.config = config
        rng = random.Random(f"{config.seed}/system")
        self.system_prompt = (
            "You are a careful assistant for a logistics company. Answer questions about the "
            "user's document briefly and only from its content.\n\nCompany handbook:\n"
            + prose(rng, config.system_words)
        )

    def document(self, user: int) -> str:
        return prose(
            random.Random(f"{self.config.seed}/document/{user}"), self.config.document_words
        )

    def question(self, user: int, round_index: int) -> str:
        rng = random.Random(f"{self.config.seed}/question/{user}/{round_index}")
        return random_question(rng)

    def messages(self, user: int, answers: list[str]) -> list[dict[str, str]]:
        """The prompt of round `len(answers)`: system, document + first question, then each
        previous answer followed by the next question."""
        round_index = len(answers)
        assert round_index < self.config.num_rounds, (round_index, self.config.num_rounds)
        first = f"Here is my document.\n\n{self.document(user)}\n\n{self.question(user, 0)}"
        result = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": first},
        ]
        for index, answer in enumerate(answers, start=1):
            result.append({"role": "assistant", "content": answer})
            result.append({"role": "user", "content": self.question(user, index)})
        return result
