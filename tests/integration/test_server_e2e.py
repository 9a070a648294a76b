"""The real default model (fp32) behind a real `tieredkv serve` process, driven by the official
openai client over loopback: streaming, multi-turn reuse, the disk tier, concurrency,
namespaces, hang-ups and SIGTERM."""

from __future__ import annotations

import concurrent.futures
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.server_process import ServerProcess

# fp32 pages of the default model: 30 layers x 2 x 3 heads x 64 x 4 B x 16 tokens = 737,280 B
MODEL = "SmolLM2-135M-Instruct"
COMMON = ["--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "8"]
# 96 MiB less the workspaces' share (136 tokens: what leaves one 2048-token sequence's 128 pages)
SMALL_TIERS = ["--device-cache-size", "96MiB", "--host-cache-size", "48MiB"]  # 128 + 68 pages

WORDS = [
    "river",
    "stone",
    "lantern",
    "orbit",
    "meadow",
    "copper",
    "signal",
    "harbor",
    "violet",
    "engine",
    "canyon",
    "whisper",
    "glacier",
    "pixel",
    "thunder",
    "archive",
    "compass",
    "ember",
    "falcon",
    "mosaic",
    "nebula",
    "quartz",
    "saddle",
    "tide",
]


def document(seed: int, num_words: int) -> str:
    """Deterministic filler text, different per seed."""
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(num_words))


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-disk")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, disk_dir: Path) -> Iterator[ServerProcess]:
    args = [*COMMON, *SMALL_TIERS, "--disk-cache-dir", str(disk_dir), "--disk-cache-size", "1GiB"]
    log = tmp_path_factory.mktemp("logs") / "cached.log"
    process = ServerProcess([*args, "--debug-endpoints"], log)
    yield process
    seconds = process.stop()
    assert process.process.returncode == 0, process.log()
    assert seconds < 10.0, f"SIGTERM took {seconds:.1f} s"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "nocache.log"
    process = ServerProcess([*COMMON, "--no-cache"], log)
    yield process
    process.stop()


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def chat(server: ServerProcess, messages: list[dict], max_tokens: int = 24, **extra) -> dict:
    """A non-streamed greedy chat completion, as raw JSON (usage details included)."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(
        server.base_url + "/v1/chat/completions", json={**body, **extra}, timeout=300
    )
    assert response.status_code == 200, response.text
    return response.json()


def model_name(server: ServerProcess) -> str:
    return client(server).models.list().data[0].id


def test_health_lists_tiers_and_o_direct(server: ServerProcess) -> None:
    health = httpx.get(server.base_url + "/health", timeout=10).json()
    assert health["ready"] is True
    assert health["tiers"] == {
        "device": "healthy",
        "host": "healthy",
        "disk": "healthy",
        "remote": "disabled",
    }
    assert isinstance(health["direct_io"], bool)
    assert health["tier_capacity_bytes"]["device"] == 128 * 737_280
    workspace = health["workspace"]
    assert workspace["budget_bytes"] == 136 * 46_080 and workspace["running"] == 0


def test_health_and_the_log_say_what_each_tier_holds(server: ServerProcess, disk_dir: Path) -> None:
    """fp32 pages of the default model: 16 tokens x 46,080 B (2 x 30 layers x 3 heads x 64 x 4)."""
    capacity = httpx.get(server.base_url + "/health", timeout=10).json()["capacity"]
    tiers = capacity["tiers"]
    assert tiers["device"] == {"bytes": 128 * 737_280, "pages": 128, "tokens": 128 * 16}
    assert tiers["host"] == {"bytes": 68 * 737_280, "pages": 68, "tokens": 68 * 16}
    disk = tiers["disk"]
    store = disk_dir / "pages-0.tkv"
    assert disk["path"] == str(store) and disk["tokens"] == disk["pages"] * 16
    assert disk["allocated_bytes"] == store.stat().st_blocks * 512 >= disk["bytes"]  # preallocated
    assert "remote" not in tiers
    memory = capacity["memory_bytes"]
    assert memory["device_tier"] == 128 * 737_280 and memory["host_tier"] == 68 * 737_280
    assert memory["weights"] > 100e6  # fp32 135M weights
    assert memory["workspace"] == 136 * 46_080  # on CPU: the rest of --device-cache-size
    assert memory["total"] == sum(v for k, v in memory.items() if k != "total")
    log = server.log()
    assert "KV: 46,080 B a token" in log and f"{store} (" in log
    assert "memory for the model and tiers" in log


def test_models_chat_and_completions(server: ServerProcess) -> None:
    name = model_name(server)
    assert name == MODEL
    api = client(server)
    reply = api.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Name a color."}]}],
        max_tokens=12,
        temperature=0,
    )
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens <= 12
    completion = api.completions.create(
        model=name, prompt="The sky is", max_tokens=8, temperature=0
    )
    assert completion.choices[0].text
    assert completion.usage.prompt_tokens > 0


def test_stream_equals_non_stream(server: ServerProcess) -> None:
    messages = [{"role": "user", "content": "Write two sentences about the sea."}]
    plain = chat(server, messages, max_tokens=40)
    stream = client(server).chat.completions.create(
        model=model_name(server),
        messages=messages,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain["choices"][0]["message"]["content"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == plain["usage"]["completion_tokens"]
    assert usage_chunk.usage.prompt_tokens == plain["usage"]["prompt_tokens"]
    details = usage_chunk.usage.prompt_tokens_details.model_dump()
    assert set(details["cached_tokens_by_tier"]) == {"device", "host", "disk", "remote"}


def conversation_turns(server: ServerProcess, seed: int, turns: int) -> list[dict]:
    """A multi-turn chat over a ~1,000-token document; returns each turn's raw reply."""
    messages = [
        {"role": "system", "content": "You answer questions about the document."},
        {"role": "user", "content": f"Document:\n{document(seed, 1100)}\n\nSummarize it."},
    ]
    replies = []
    for turn in range(turns):
        reply = chat(server, messages, max_tokens=16)
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        messages.append({"role": "user", "content": f"Question {turn}: which word comes first?"})
    return replies


def test_next_turn_reuses_history(server: ServerProcess) -> None:
    first, second = conversation_turns(server, seed=1, turns=2)
    history = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    assert history >= 1000
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * history, (cached, history)


def test_history_demoted_to_disk_answers_like_no_cache(
    server: ServerProcess, baseline: ServerProcess
) -> None:
    messages = [{"role": "user", "content": f"Document:\n{document(11, 1000)}\n\nSummarize."}]
    chat(server, messages, max_tokens=8)
    for seed in (12, 13, 14, 15):  # other conversations, more than device + host together
        chat(server, [{"role": "user", "content": document(seed, 1000)}], max_tokens=8)
    follow_up = [
        *messages,
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "More."},
    ]
    reply = chat(server, follow_up, max_tokens=24)
    by_tier = reply["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]
    assert by_tier["disk"] > 0, by_tier
    assert sum(by_tier.values()) == reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    expected = chat(baseline, follow_up, max_tokens=24)
    assert reply["choices"][0]["message"]["content"] == expected["choices"][0]["message"]["content"]
    assert expected["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def running_gauge(server: ServerProcess) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    match = re.search(r"^tieredkv_requests_running (\S+)$", text, re.MULTILINE)
    assert match, "tieredkv_requests_running missing from /metrics"
    return float(match.group(1))


def debug_cache(server: ServerProcess) -> dict:
    response = httpx.get(server.base_url + "/debug/cache", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_concurrent_streams_equal_sequential_runs(server: ServerProcess) -> None:
    prompts = [f"Give me one fact about the number {i} and {document(i, 12)}." for i in range(8)]
    sequential = [
        chat(server, [{"role": "user", "content": p}], max_tokens=32)["choices"][0]["message"][
            "content"
        ]
        for p in prompts
    ]
    name, api = model_name(server), client(server)

    def stream(prompt: str) -> str:
        chunks = api.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=32,
            temperature=0,
            stream=True,
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    seen_running, done = [], threading.Event()

    def watch() -> None:  # every 50 ms: a tight loop of scrapes would take a core from the server
        while not done.wait(0.05):
            seen_running.append(running_gauge(server))

    watcher = threading.Thread(target=watch)
    watcher.start()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        concurrent_outputs = list(pool.map(stream, prompts))
    done.set()
    watcher.join()
    assert concurrent_outputs == sequential
    assert max(seen_running) > 1
    state = debug_cache(server)
    assert state["ok"], state["problems"]
    assert state["locked_nodes"] == 0


def test_clients_hanging_up_free_their_pages(server: ServerProcess) -> None:
    for i in range(3):
        with httpx.stream(
            "POST",
            server.base_url + "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Count to one hundred, {i}."}],
                "max_tokens": 500,
                "stream": True,
            },
            timeout=60,
        ) as response:
            for _, line in zip(range(4), response.iter_lines(), strict=False):
                assert line.startswith("data:") or not line
    # a request after the hang-ups runs once the aborts were applied on the engine thread
    chat(server, [{"role": "user", "content": "Hello"}], max_tokens=2)
    state = debug_cache(server)
    assert state["ok"], state["problems"]
    assert state["locked_nodes"] == 0
    assert state["requests"] == {"waiting": 0, "promoting": 0, "running": 0}


def test_namespaces_share_nothing(server: ServerProcess) -> None:
    messages = [{"role": "user", "content": f"Private notes: {document(21, 200)}"}]
    chat(server, messages, max_tokens=2, cache_salt="tenant-a")
    other = chat(server, messages, max_tokens=2, cache_salt="tenant-b")
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    same = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0},
        headers={"X-Cache-Namespace": "tenant-a"},
        timeout=120,
    ).json()
    assert same["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_bad_input_gets_openai_errors(server: ServerProcess) -> None:
    url = server.base_url + "/v1/chat/completions"
    cases = [
        ({"model": MODEL, "messages": []}, 400, None),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 129}, 400, None),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
            400,
            None,
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000},
            400,
            "context_length_exceeded",
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "word " * 3000}]},
            400,
            "context_length_exceeded",
        ),
    ]
    for body, status, code in cases:
        response = httpx.post(url, json=body, timeout=60)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert set(error) >= {"message", "type", "param", "code"}
        if code:
            assert error["code"] == code
    malformed = httpx.post(url, content=b"{not json", timeout=10)
    assert malformed.status_code == 400
    assert "detail" not in malformed.json()
