"""Fair tenants through a real `tieredkv serve` (the default model, fp32) and the openai client:
one tenant floods with unique long prompts, more than device and host hold together, between
two turns of three other tenants' chats; each chat's second turn still finds its whole history
in device or host memory (the server has no disk tier, so anything pushed out would be gone)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai

from tests.integration.server_process import ServerProcess
from tests.integration.test_server_e2e import document

MODEL = "SmolLM2-135M-Instruct"
# fp32 pages of 16 tokens: 737,280 B; device 68 pages, host 68; the flood is 4 x ~44 pages
ARGS = [
    "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "4",
    "--device-cache-size", "48MiB", "--host-cache-size", "48MiB", "--debug-endpoints",
]  # fmt: skip


def test_a_flooding_tenant_does_not_push_out_the_others_chats(tmp_path: Path) -> None:
    server = ServerProcess(ARGS, tmp_path / "server.log")
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)

        def turn(salt: str, messages: list[dict], max_tokens: int):
            return client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=max_tokens,
                temperature=0,
                extra_body={"cache_salt": salt},
            )

        chats = {
            f"chat-{i}": [{"role": "user", "content": f"Notes {i}. {document(20 + i, 120)}"}]
            for i in range(3)
        }
        firsts = {salt: turn(salt, history, 4) for salt, history in chats.items()}
        for i in range(4):  # ~700 tokens each, all unique: 176 pages, device + host hold 136
            flood = [{"role": "user", "content": document(60 + i, 520)}]
            turn("flood", flood, 1)
        pages = httpx.get(server.base_url + "/debug/cache", timeout=30).json()["namespaces"]
        assert set(pages) == {"flood", *chats} and pages["flood"]["host"] > 0, pages
        for salt, first in firsts.items():  # every chat's full pages, still on host
            assert pages[salt]["host"] >= first.usage.prompt_tokens // 16, pages
        for salt, history in chats.items():
            first = firsts[salt]
            history += [
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And in one word?"},
            ]
            second = turn(salt, history, 2)
            details = second.usage.prompt_tokens_details
            assert details.cached_tokens >= first.usage.prompt_tokens - 16, (salt, details)
    finally:
        server.stop()
