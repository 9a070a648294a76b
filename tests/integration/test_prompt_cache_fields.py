"""OpenAI's prompt-caching fields through a real `tieredkv serve` (the default model, fp32) and
the official SDK: `prompt_cache_retention` "24h" keeps a prompt reusable after a flood larger
than every tier while the same traffic with the default retention is gone, `--retention-budget`
releases the least recently used retained prompt first, `prompt_cache_key` keeps its group
warm as a session does, and bad values are 400s."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.server_process import ServerProcess
from tests.integration.test_server_e2e import document
from tests.router_process import RouterProcess, require_router

MODEL = "SmolLM2-135M-Instruct"
# fp32 pages of 16 tokens (737,280 B): device 91 pages, host 45, disk about 60, so a flood of
# 6 prompts of about 45 pages each passes through every tier; a budget of 22 retained pages
TINY = [
    "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "4",
    "--device-cache-size", "64MiB", "--host-cache-size", "32MiB", "--disk-cache-size", "44MiB",
    "--retention-budget", "16MiB",
]  # fmt: skip
SYSTEM = [{"role": "system", "content": "You answer from this handbook. " + document(3, 180)}]
HTTP = httpx.Client(timeout=120.0)


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def flood(server: ServerProcess, rounds: int, seed: int) -> None:
    """Unrelated long prompts, more pages than the three tiers hold together."""
    for i in range(rounds):
        client(server).completions.create(
            model=MODEL, prompt=document(seed + i, 520), max_tokens=1, temperature=0
        )


def ask(server: ServerProcess, **fields: str) -> openai.types.CompletionUsage:
    reply = client(server).chat.completions.create(
        model=MODEL,
        messages=[*SYSTEM, {"role": "user", "content": "What does it say first?"}],
        max_tokens=1,
        temperature=0,
        **fields,
    )
    return reply.usage


def complete(server: ServerProcess, prompt: str, **fields: str) -> openai.types.CompletionUsage:
    """The SDK's legacy completions take the fields through extra_body."""
    reply = client(server).completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, temperature=0, extra_body=fields
    )
    return reply.usage


def full_pages(usage: openai.types.CompletionUsage) -> int:
    """Tokens a repeat of this prompt reuses at best (whole pages of all but its last token)."""
    return (usage.prompt_tokens - 1) // 16 * 16


def metric(server: ServerProcess, name: str, labels: str = "", least: float = 0.0) -> float:
    """A series' value once it is at least `least`: the engine mirrors its figures at the end
    of the step that finished a request, which may come after the reply (10 s at most)."""
    pattern = "(?m)^" + re.escape(name + (f"{{{labels}}}" if labels else "")) + r" (\S+)$"
    deadline = time.monotonic() + 10.0
    while True:
        found = re.search(pattern, HTTP.get(server.base_url + "/metrics").text)
        assert found, f"{name} {labels} not in /metrics"
        if float(found.group(1)) >= least or time.monotonic() > deadline:
            return float(found.group(1))
        time.sleep(0.2)  # test code: waiting for the engine thread's next step


@pytest.fixture
def server(tmp_path: Path):
    args = [*TINY, "--disk-cache-dir", str(tmp_path / "kv"), "--session-think-time", "0"]
    process = ServerProcess(args, tmp_path / "retention.log")
    yield process
    process.stop()


def test_a_24h_prompt_outlives_a_flood_and_the_budget_drops_the_lru_one(server) -> None:
    retained = ask(server, prompt_cache_retention="24h", prompt_cache_key="handbook")
    note = "An ordinary note. " + document(5, 180)
    ordinary = complete(server, note, prompt_cache_retention="in_memory")
    flood(server, 6, seed=40)
    again = ask(server, prompt_cache_retention="24h")
    assert again.prompt_tokens_details.cached_tokens == full_pages(retained)
    assert again.prompt_tokens_details.model_extra["cached_tokens_by_tier"]["disk"] > 0
    assert complete(server, note).prompt_tokens_details.cached_tokens == 0  # gone everywhere
    disk_pages = metric(server, "tieredkv_retained_pages", 'tier="disk"', least=1)
    assert disk_pages >= full_pages(retained) // 16
    assert ordinary.prompt_tokens > 16 * 10  # the note was long enough to have had pages
    # a second retained prompt does not fit beside the first: the older one loses its guarantee
    assert metric(server, "tieredkv_retention_evicted_total") == 0
    other = "A retained reference. " + document(9, 180)
    kept = complete(server, other, prompt_cache_retention="24h", prompt_cache_key="reference")
    assert metric(server, "tieredkv_retention_evicted_total", least=1) == 1
    flood(server, 6, seed=80)
    assert ask(server).prompt_tokens_details.cached_tokens == 0
    assert complete(server, other).prompt_tokens_details.cached_tokens == full_pages(kept)


def test_bad_prompt_cache_fields_are_400s(server) -> None:
    sdk = client(server)
    messages = [{"role": "user", "content": "hi"}]
    for fields, param in (
        ({"prompt_cache_retention": "1h"}, "prompt_cache_retention"),
        ({"prompt_cache_retention": 24}, "prompt_cache_retention"),
        ({"prompt_cache_key": "k" * 257}, "prompt_cache_key"),
        ({"prompt_cache_key": "é" * 129}, "prompt_cache_key"),  # 258 UTF-8 bytes
    ):
        with pytest.raises(openai.BadRequestError) as chat_error:
            sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, **fields)
        assert chat_error.value.body["param"] == param, chat_error.value.body
        with pytest.raises(openai.BadRequestError) as completion_error:
            sdk.completions.create(model=MODEL, prompt="hi", max_tokens=1, extra_body=fields)
        assert completion_error.value.body["param"] == param
    accepted = sdk.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=1,
        prompt_cache_key="é" * 128,  # 256 bytes: the limit
        prompt_cache_retention=None,
    )
    assert accepted.usage.completion_tokens == 1


def turns(server: ServerProcess, salt: str, **fields: str) -> dict[str, int]:
    """Two turns sharing a history with a flood between them; the second's tokens by tier."""
    history = [
        {"role": "system", "content": "Notes for this group. " + document(11, 200)},
        {"role": "user", "content": "Summarise the notes."},
    ]
    sdk, extra = client(server), {"cache_salt": salt}
    first = sdk.chat.completions.create(
        model=MODEL, messages=history, max_tokens=4, temperature=0, extra_body=extra, **fields
    )
    flood(server, 3, seed=120)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And in one word?"},
    ]
    second = sdk.chat.completions.create(
        model=MODEL, messages=history, max_tokens=1, temperature=0, extra_body=extra, **fields
    )
    return second.usage.prompt_tokens_details.model_extra["cached_tokens_by_tier"]


def test_a_prompt_cache_key_keeps_its_group_warm_as_a_session(tmp_path: Path) -> None:
    # plain LRU across namespaces, so only the key's hold keeps the first group's pages on host
    args = [*TINY, "--disk-cache-dir", str(tmp_path / "kv"), "--namespace-share", "1"]
    server = ServerProcess(args, tmp_path / "key.log")
    try:
        warm = turns(server, "keyed", prompt_cache_key="notes-group")
        assert warm["disk"] == 0 and warm["device"] + warm["host"] > 0, warm
        cold = turns(server, "unkeyed")  # the same turns, no key: pushed out of memory
        assert cold["device"] + cold["host"] == 0, cold
    finally:
        server.stop()


def test_sglang_router_keeps_a_key_on_one_replica_through_its_header(tmp_path: Path) -> None:
    """The operations guide's recipe: sglang-router's `manual` policy reads no body field, so
    the client sends its prompt_cache_key as X-SMG-Routing-Key too."""
    require_router()
    small = ["--dtype", "float32", "--max-model-len", "512", "--device-cache-size", "64MiB"]
    replicas = [ServerProcess(small, tmp_path / f"replica-{i}.log") for i in range(2)]
    router = RouterProcess([r.base_url for r in replicas], tmp_path / "router.log", "manual")
    try:
        router.wait_for({r.base_url for r in replicas})
        sdk = openai.OpenAI(base_url=router.base_url + "/v1", api_key="unused", max_retries=0)
        for key in ("group-a", "group-b", "group-c"):
            before = [metric(r, "tieredkv_prompt_tokens_total") for r in replicas]
            for turn in range(3):
                sdk.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"Turn {turn} of {key}."}],
                    max_tokens=1,
                    prompt_cache_key=key,
                    extra_headers={"X-SMG-Routing-Key": key},
                )
            after = [metric(r, "tieredkv_prompt_tokens_total") for r in replicas]
            grown = [a > b for a, b in zip(after, before, strict=True)]
            assert grown.count(True) == 1, (key, grown)  # every turn on the same replica
    finally:
        router.stop()
        for replica in replicas:
            replica.stop()
