"""The workload generator: deterministic from the seed, realistic, conversations that grow."""

import pytest

from tieredkv.bench.workload import Workload, WorkloadConfig, prose
from tieredkv.errors import ConfigError


def test_same_seed_same_text_other_seed_other_text() -> None:
    a = Workload(WorkloadConfig(seed=7, document_words=300))
    b = Workload(WorkloadConfig(seed=7, document_words=300))
    c = Workload(WorkloadConfig(seed=8, document_words=300))
    assert a.system_prompt == b.system_prompt
    assert [a.document(u) for u in range(3)] == [b.document(u) for u in range(3)]
    assert a.question(2, 1) == b.question(2, 1)
    assert a.document(0) != c.document(0)
    assert a.system_prompt != c.system_prompt


def test_users_have_different_documents_but_share_the_system_prompt() -> None:
    workload = Workload(WorkloadConfig(num_users=3, document_words=200))
    docs = {workload.document(u) for u in range(3)}
    assert len(docs) == 3
    first = [workload.messages(u, [])[0] for u in range(3)]
    assert all(m == {"role": "system", "content": workload.system_prompt} for m in first)


def test_text_reads_like_prose() -> None:
    import random

    text = prose(random.Random(1), 500)
    words = text.split()
    assert len(words) >= 500
    sentences = [s for s in text.replace("\n", " ").split(".") if s.strip()]
    assert len(sentences) >= 40
    assert all(s.strip()[0].isupper() for s in sentences)
    assert "\n\n" in text  # paragraphs
    assert len(set(words)) > 80  # not one word repeated


def test_conversation_grows_with_the_actual_previous_answers() -> None:
    workload = Workload(WorkloadConfig(num_rounds=3, document_words=100))
    round0 = workload.messages(1, [])
    round2 = workload.messages(1, ["first answer", "second answer"])
    assert [m["role"] for m in round0] == ["system", "user"]
    assert round2[: len(round0)] == round0  # the history is a prefix: a cache can reuse it
    assert [m["content"] for m in round2 if m["role"] == "assistant"] == [
        "first answer",
        "second answer",
    ]
    assert round2[-1] == {"role": "user", "content": workload.question(1, 2)}
    assert workload.document(1) in round0[1]["content"]


def test_too_many_answers_is_an_internal_error() -> None:
    workload = Workload(WorkloadConfig(num_rounds=1, document_words=10))
    with pytest.raises(AssertionError):
        workload.messages(0, ["one"])


@pytest.mark.parametrize("field", ["num_users", "num_rounds", "max_tokens"])
def test_bad_sizes_are_config_errors(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        WorkloadConfig(**{field: 0})
