"""Pinned prefixes through a real `tieredkv serve` (the default model, fp32): `POST` and
`DELETE /v1/cache/pin`, `--pin-file`, the per-namespace budget, pins that hold on host while
other prompts push the rest of the host tier to disk, and pins that survive a restart."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai

from tests.integration.server_process import ServerProcess
from tests.integration.test_server_e2e import document

MODEL = "SmolLM2-135M-Instruct"
# fp32 pages of 16 tokens: 737,280 B; device 91 pages, host 45, a pin budget of 22 pages
ARGS = [
    "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "4",
    "--device-cache-size", "64MiB", "--host-cache-size", "32MiB", "--pin-budget", "16MiB",
    "--disk-cache-size", "1GiB", "--debug-endpoints",
]  # fmt: skip
SYSTEM = [{"role": "system", "content": "You answer from this handbook. " + document(3, 180)}]
FILE_PROMPT = "Reference sheet: " + document(9, 120)
# a pin computes its prefix: 0.4 s alone here, but CI's other worker shares the two cores, and
# httpx's default of 5 s once ran out (a `ReadTimeout` on the first pin)
HTTP = httpx.Client(timeout=120.0)


def start(tmp_path: Path, disk: Path, name: str, *extra: str) -> ServerProcess:
    return ServerProcess([*ARGS, "--disk-cache-dir", str(disk), *extra], tmp_path / name)


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def flood(server: ServerProcess, rounds: int, seed: int) -> None:
    """Unrelated long prompts: plain LRU would push every older page off the host."""
    for i in range(rounds):
        client(server).completions.create(
            model=MODEL, prompt=document(seed + i, 520), max_tokens=1, temperature=0
        )


def ask(server: ServerProcess, question: str) -> dict[str, int]:
    reply = client(server).chat.completions.create(
        model=MODEL,
        messages=[*SYSTEM, {"role": "user", "content": question}],
        max_tokens=2,
        temperature=0,
    )
    return reply.usage.prompt_tokens_details.model_extra["cached_tokens_by_tier"]


def wait_for_pins(server: ServerProcess, count: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if HTTP.get(server.base_url + "/debug/cache").json()["pins"] >= count:
            return
        time.sleep(0.5)  # test code: the server pins in the background at start
    raise AssertionError(f"{count} pins not made within 120 s")


def test_pins_hold_on_host_under_pressure_and_survive_a_restart(tmp_path: Path) -> None:
    disk = tmp_path / "kv"
    pin_file = tmp_path / "pins.jsonl"
    pin_file.write_text("# pinned at start\n\n" + json.dumps({"prompt": FILE_PROMPT}) + "\n")
    server = start(tmp_path, disk, "first.log")
    try:
        pinned = HTTP.post(server.base_url + "/v1/cache/pin", json={"messages": SYSTEM})
        assert pinned.status_code == 200, pinned.text
        body = pinned.json()
        assert body["pinned_pages"] >= 10 and body["budget_pages"] == 22
        # a control prefix computed at the same time, not pinned
        control = "An unpinned note. " + document(5, 180)
        client(server).completions.create(model=MODEL, prompt=control, max_tokens=1)
        flood(server, 4, seed=40)
        by_tier = ask(server, "What does the handbook say first?")
        assert by_tier["disk"] == 0 and by_tier["remote"] == 0
        assert by_tier["device"] + by_tier["host"] >= body["pinned_tokens"]
        after = client(server).completions.create(
            model=MODEL, prompt=control + " More.", max_tokens=1
        )
        assert after.usage.prompt_tokens_details.model_extra["cached_tokens_by_tier"]["disk"] > 0
        too_big = HTTP.post(server.base_url + "/v1/cache/pin", json={"prompt": document(7, 400)})
        assert too_big.status_code == 400
        assert too_big.json()["error"]["code"] == "pin_budget_exceeded"
        url = server.base_url + "/v1/cache/pin"
        short = HTTP.post(url, json={"prompt": "x"})  # no full page
        assert short.status_code == 400 and short.json()["error"]["code"] == "prompt_too_short"
        assert HTTP.post(url, json={}).status_code == 400  # names nothing
    finally:
        assert server.stop() < 10.0
    restarted = start(tmp_path, disk, "second.log", "--pin-file", str(pin_file))
    try:
        wait_for_pins(restarted, 2)  # the saved one and the pin file's
        flood(restarted, 4, seed=80)
        # the pinned pages come from device or host; a page after them may come from disk
        by_tier = ask(restarted, "And what does it say last?")
        assert by_tier["device"] + by_tier["host"] >= body["pinned_tokens"], by_tier
        file_hit = client(restarted).completions.create(
            model=MODEL, prompt=FILE_PROMPT + " Summarise.", max_tokens=1
        )
        tiers = file_hit.usage.prompt_tokens_details.model_extra["cached_tokens_by_tier"]
        assert tiers["device"] + tiers["host"] >= 96, tiers  # its full pages: 112 tokens
        url = restarted.base_url + "/v1/cache/pin"
        assert HTTP.request("DELETE", url, json={"messages": SYSTEM}).status_code == 200
        gone = HTTP.request("DELETE", url, json={"messages": SYSTEM})
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "pin_not_found"
        assert HTTP.post(url, json={"prompt": "hi", "messages": SYSTEM}).status_code == 400
    finally:
        restarted.stop()


def chat_turns(server: ServerProcess, salt: str, user: str | None) -> dict[str, int]:
    """Two turns of one conversation with other traffic between them; the second's usage."""
    history = [
        {"role": "system", "content": "Notes for this chat. " + document(11, 200)},
        {"role": "user", "content": "Summarise the notes."},
    ]
    extra = {"cache_salt": salt}
    kwargs = {"user": user} if user is not None else {}
    first = client(server).chat.completions.create(
        model=MODEL, messages=history, max_tokens=8, temperature=0, extra_body=extra, **kwargs
    )
    flood(server, 4, seed=120)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And in one word?"},
    ]
    second = client(server).chat.completions.create(
        model=MODEL, messages=history, max_tokens=2, temperature=0, extra_body=extra, **kwargs
    )
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
    return second.usage.prompt_tokens_details.model_extra["cached_tokens_by_tier"]


def test_a_named_conversation_stays_on_host_between_turns(tmp_path: Path) -> None:
    # plain LRU across namespaces: fair shares alone would keep both chats on host, since the
    # flood (in the default namespace) is above its share; here only the session may keep one
    server = start(tmp_path, tmp_path / "kv", "sessions.log", "--namespace-share", "1")
    try:
        warm = chat_turns(server, "named", user="alice")
        assert warm["disk"] == 0 and warm["device"] + warm["host"] > 0, warm
        cold = chat_turns(server, "unnamed", user=None)  # the same turns, no conversation
        assert cold["disk"] > 0, cold
    finally:
        server.stop()
