"""Two real `tieredkv serve` replicas (the default model, fp32, small tiers) sharing a remote
tier on a real Redis, behind SGLang's real router (`sglang-router`, policy `cache_aware`),
driven by the official openai client: the router registers both under the served model's
name, a conversation's follow-up turns reach the replica that holds its prefix (and reuse it),
a new conversation goes to the other replica, and a stopped replica's conversation moves to
the one left, which finds its history in Redis: the same greedy tokens as the stopped replica
gave, from the history's pages, not computed again."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.integration.server_process import ServerProcess
from tests.integration.test_server_e2e import MODEL, document
from tests.redis_servers import RedisServer, require_redis
from tests.router_process import RouterProcess, require_router

KEY = "router-test-key"  # the replicas' key: the router passes the client's header through
REPLICA_ARGS = [
    *("--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "4"),
    *("--device-cache-size", "64MiB", "--host-cache-size", "0"),  # 91 fp32 pages
]
PAGE_SIZE = 16  # the default
REDIS_PASSWORD = "router-test-redis"  # from the environment: never on a command line


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    require_router()
    require_redis()
    logs = tmp_path_factory.mktemp("replicas")
    redis = RedisServer(tmp_path_factory.mktemp("redis"), password=REDIS_PASSWORD).start()
    env = {"TIEREDKV_API_KEY": KEY, "TIEREDKV_REDIS_PASSWORD": REDIS_PASSWORD}
    # generous remote budgets: the test checks where pages come from, not how fast (a busy CI
    # machine can run a fetch past the default budget, which is then rightly a miss)
    args = [*REPLICA_ARGS, *redis.serve_flags(), "--remote-budget-scale", "20"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(ServerProcess, args, logs / f"replica{i}.log", env=env) for i in range(2)
        ]
        servers = [future.result() for future in futures]
    yield servers
    for server in servers:
        server.stop()
    redis.stop()


@pytest.fixture(scope="module")
def router(replicas: list[ServerProcess], tmp_path_factory: pytest.TempPathFactory):
    router = RouterProcess(
        [server.base_url for server in replicas], tmp_path_factory.mktemp("router") / "log"
    )
    yield router
    router.stop()


def prompt_tokens(server: ServerProcess) -> float:
    """The replica's `tieredkv_prompt_tokens_total` (0 once it has stopped)."""
    if server.process.poll() is not None:
        return 0.0
    for line in httpx.get(server.base_url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("tieredkv_prompt_tokens_total "):
            return float(line.split()[1])
    raise AssertionError("no tieredkv_prompt_tokens_total in /metrics")


class Conversation:
    """One chat with a long system prompt of its own, turn by turn through the router."""

    def __init__(self, client: openai.OpenAI, seed: int) -> None:
        self.client = client
        system = f"Conversation {seed}. Remember this text: {document(seed, 150)}"
        self.messages: list[dict] = [{"role": "system", "content": system}]

    def ask(self, question: str, keep: bool = True) -> int:
        """One greedy turn; returns its cached_tokens (`last_by_tier`: per tier, `last_tokens`:
        the answer's tokens). `keep=False` leaves the question and answer out of the history."""
        messages = [*self.messages, {"role": "user", "content": question}]
        reply = self.client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, temperature=0.0, logprobs=True
        )
        answer = reply.choices[0].message.content
        assert answer, reply
        self.last_tokens = [entry.token for entry in reply.choices[0].logprobs.content]
        assert "".join(self.last_tokens) == answer
        if keep:
            self.messages = [*messages, {"role": "assistant", "content": answer}]
        self.last_prompt_tokens = reply.usage.prompt_tokens
        details = reply.usage.prompt_tokens_details.model_dump()
        self.last_by_tier = details["cached_tokens_by_tier"]
        return details["cached_tokens"]

    def turn(
        self, question: str, replicas: list[ServerProcess], keep: bool = True
    ) -> tuple[int, int]:
        """One turn, alone in flight; returns (the replica that answered, cached_tokens)."""
        before = [prompt_tokens(server) for server in replicas]
        cached = self.ask(question, keep)
        grew = [i for i, server in enumerate(replicas) if prompt_tokens(server) > before[i]]
        assert len(grew) == 1, (before, grew)
        return grew[0], cached


def test_cache_aware_router_keeps_conversations_on_their_replica(
    router: RouterProcess, replicas: list[ServerProcess]
) -> None:
    urls = {server.base_url for server in replicas}
    workers = router.wait_for(urls)
    assert {w["model_id"] for w in workers} == {MODEL}  # learnt from /server_info

    client = openai.OpenAI(base_url=router.base_url + "/v1", api_key=KEY, max_retries=0)
    first, second = Conversation(client, seed=1), Conversation(client, seed=2)
    # Two new conversations at once: no prefix matches, so the router picks the replica with
    # fewer requests in flight, and the second goes where the first is not.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        assert list(pool.map(Conversation.ask, (first, second), ("Hello?", "Hi?"))) == [0, 0]
    home_a, cached = first.turn("What is the first word?", replicas)
    assert cached > 0  # its first turn's prefix is on the replica it came back to
    home_b, cached = second.turn("What is the first word?", replicas)
    assert cached > 0 and home_b != home_a
    for conversation, home in ((first, home_a), (second, home_b)):
        replica, cached = conversation.turn("And the second word?", replicas)
        assert replica == home and cached > 0

    stranger = openai.OpenAI(base_url=router.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):  # the replicas' key rules still apply
        stranger.chat.completions.create(model=MODEL, messages=first.messages, max_tokens=1)

    # the next turn's answer from the replica that holds the history: the reference answer
    replica, _ = first.turn("And the third word?", replicas, keep=False)
    assert replica == home_a
    reference = first.last_tokens

    replicas[home_a].stop()
    router.wait_for(urls - {replicas[home_a].base_url})
    replica, cached = first.turn("And the third word?", replicas)
    # answered by the replica left, which never saw this conversation: its history (computed
    # on the stopped replica) comes from Redis, every full page of the prompt, and gives the
    # same greedy answer
    assert replica == home_b
    assert first.last_tokens == reference
    assert cached >= first.last_prompt_tokens - PAGE_SIZE
    assert first.last_by_tier["remote"] > 0 and sum(first.last_by_tier.values()) == cached
