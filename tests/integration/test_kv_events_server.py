"""A real `tieredkv serve` publishing KV events on real ZMQ sockets, read with vLLM's schema:
a prompt's pages stored on the device and written through to host and disk, removed and
cleared by a flush, the stream replayable, the counters on /metrics."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.integration.server_process import ServerProcess
from tests.unit.kv_events.vllm_schema import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ConsumerView,
    Subscriber,
)

MODEL = "SmolLM2-135M-Instruct"
PAGE_SIZE = 16
ARGS = [
    "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "4",
    "--device-cache-size", "96MiB", "--host-cache-size", "48MiB", "--page-size", str(PAGE_SIZE),
]  # fmt: skip


def metric(text: str, name: str) -> float:
    [line] = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


def test_a_served_prompt_is_published_through_the_tiers_and_the_flush(tmp_path: Path) -> None:
    events_at, replay_at = f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/replay"
    flags = ["--kv-events-endpoint", events_at, "--kv-events-replay-endpoint", replay_at]
    flags += ["--kv-events-topic", "tkv", "--disk-cache-dir", str(tmp_path / "kv")]
    server = ServerProcess([*ARGS, *flags, "--disk-cache-size", "256MiB"], tmp_path / "log")
    subscriber = Subscriber(events_at, replay_at, b"tkv")
    try:
        prompt = [(7 * i) % 5000 + 100 for i in range(100)]  # 6 full pages
        reply = httpx.post(
            server.base_url + "/v1/completions",
            json={"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        events = subscriber.read_events()
        on_device = [e for e in events if isinstance(e, BlockStored) and e.medium == "GPU"]
        assert on_device[0].parent_block_hash is None
        assert [t for e in on_device for t in e.token_ids][:96] == prompt[:96]
        assert all(e.block_size == PAGE_SIZE for e in on_device)
        device_hashes = [h for e in on_device for h in e.block_hashes]
        assert len(device_hashes) == len(set(device_hashes)) >= 6
        assert all(0 <= h < 1 << 64 for h in device_hashes)
        view = ConsumerView()
        view.apply(events)
        assert set(device_hashes) == view.held()["GPU"]
        assert set(device_hashes[:6]) <= view.held()["CPU"]  # write-through, the default
        assert set(device_hashes[:6]) <= view.held()["STORAGE"]

        flushed = httpx.post(server.base_url + "/v1/cache/flush", timeout=60).json()
        assert flushed["flushed_pages"] > 0
        after = subscriber.read_events()
        view.apply(after)
        assert view.held() == {}
        assert any(isinstance(e, BlockRemoved) for e in after)
        assert isinstance(after[-1], AllBlocksCleared)

        assert subscriber.replay(0) == subscriber.messages  # the whole stream is kept
        text = httpx.get(server.base_url + "/metrics", timeout=30).text
        published = metric(text, "tieredkv_kv_events_published_total")
        assert published == len(subscriber.events())
        assert metric(text, "tieredkv_kv_events_dropped_total") == 0
    finally:
        subscriber.close()
        server.stop()
