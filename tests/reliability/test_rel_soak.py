"""Soak (slow): 16 concurrent streaming clients in long multi-turn chats over tiny tiers, so
demotion and promotion never stop, with abrupt hang-ups mixed in. Zero errors, bounded memory,
check_integrity() holds at the end with every lock released, and a sample of the answers equals
the --no-cache server's.

TKV_SOAK_SECONDS sets the duration (default 150); the figures are printed and written to
TKV_SOAK_REPORT (default: soak.json in the test's tmp dir)."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.reliability.harness import (
    COMMON,
    MODEL,
    Baseline,
    FaultServer,
    disk_args,
    follow_up,
    opening,
)

SOAK_SECONDS = float(os.environ.get("TKV_SOAK_SECONDS", "150"))
NUM_CLIENTS = 16
MAX_TOKENS = 24
MAX_MODEL_LEN = 512
HANG_UP_EVERY = 7  # every 7th request (over all clients) hangs up after its first chunks
SOAK_TIERS = ["--device-cache-size", "32MiB", "--host-cache-size", "16MiB"]


@dataclass
class SoakStats:
    requests: int = 0
    completed: int = 0
    hang_ups: int = 0
    errors: list[str] = field(default_factory=list)
    ttft_seconds: list[float] = field(default_factory=list)
    answers: list[tuple[list[dict], str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def one_request(server: FaultServer, messages: list[dict], hang_up: bool, stats: SoakStats):
    """Stream one turn; returns (answer, prompt_tokens), or None after a hang-up or an error."""
    body = {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    start, text, usage, chunks = time.monotonic(), "", None, 0
    try:
        with httpx.stream(
            "POST", server.base_url + "/v1/chat/completions", json=body, timeout=300
        ) as response:
            if response.status_code != 200:
                raise AssertionError(f"status {response.status_code}: {response.read()[:200]!r}")
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line.removeprefix("data: "))
                if "error" in event:
                    raise AssertionError(f"error event {event['error']}")
                usage = event.get("usage") or usage
                for choice in event["choices"]:
                    if chunks == 0:
                        with stats.lock:
                            stats.ttft_seconds.append(time.monotonic() - start)
                    chunks += 1
                    text += choice["delta"].get("content") or ""
                if hang_up and chunks >= 3:
                    return None  # leaving the with-block closes the connection mid-stream
    except (AssertionError, httpx.HTTPError) as error:
        with stats.lock:
            stats.errors.append(repr(error))
        return None
    assert usage is not None
    return text, usage["prompt_tokens"]


def client(server: FaultServer, index: int, deadline: float, stats: SoakStats) -> None:
    rng = random.Random(index)
    seed = index * 1000
    messages = opening(seed, rng.randrange(60, 200))
    turn = 0
    while time.monotonic() < deadline:
        turn += 1
        with stats.lock:
            stats.requests += 1
            hang_up = stats.requests % HANG_UP_EVERY == 0
        result = one_request(server, messages, hang_up, stats)
        if result is None:
            with stats.lock:
                stats.hang_ups += hang_up
            continue  # the same turn again
        text, prompt_tokens = result
        with stats.lock:
            stats.completed += 1
            stats.answers.append((messages, text))
        if prompt_tokens + 3 * MAX_TOKENS + 40 > MAX_MODEL_LEN:  # the chat is full: a new one
            seed += 1
            messages = opening(seed, rng.randrange(60, 200))
        else:
            messages = follow_up(messages, text, f"Turn {turn}: tell me more about word {turn}.")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.mark.slow
def test_soak(tmp_path: Path, baseline: Baseline) -> None:
    args = [*COMMON, *SOAK_TIERS, *disk_args(tmp_path / "kv", "256MiB")]
    args += ["--max-num-seqs", "8", "--debug-endpoints"]
    server = FaultServer(args, tmp_path / "server.log")
    stats, rss = SoakStats(), []
    deadline = time.monotonic() + SOAK_SECONDS
    clients = [
        threading.Thread(target=client, args=(server, i, deadline, stats))
        for i in range(NUM_CLIENTS)
    ]
    try:
        for thread in clients:
            thread.start()
        while any(thread.is_alive() for thread in clients):
            rss.append(server.rss_bytes())
            time.sleep(1.0)  # test code: sampling another process's memory
        for thread in clients:
            thread.join()
        state = server.debug_cache()
        metrics = server.metrics()
        peak_rss = server.rss_bytes("VmHWM")
        sample = random.Random(0).sample(stats.answers, min(20, len(stats.answers)))
    finally:
        server.stop()
    assert server.process.returncode == 0
    figures = {
        "seconds": SOAK_SECONDS,
        "clients": NUM_CLIENTS,
        "requests": stats.requests,
        "completed": stats.completed,
        "hang_ups": stats.hang_ups,
        "errors": len(stats.errors),
        "ttft_p50_s": percentile(stats.ttft_seconds, 0.5),
        "ttft_p99_s": percentile(stats.ttft_seconds, 0.99),
        "peak_rss_mib": peak_rss / 2**20,
        "rss_first_third_max_mib": max(rss[: len(rss) // 3]) / 2**20,
        "rss_last_third_max_mib": max(rss[-(len(rss) // 3) :]) / 2**20,
        "preemptions": metrics["preemptions_total"],
        "evicted": {k: v for k, v in metrics.items() if k.startswith("evicted_pages_total")},
        "transfer_bytes": {k: v for k, v in metrics.items() if k.startswith("transfer_bytes")},
        "cache_hit_tokens": {k: v for k, v in metrics.items() if k.startswith("cache_hit")},
        "disk_page_errors": {k: v for k, v in metrics.items() if k.startswith("disk_page")},
    }
    report = Path(os.environ.get("TKV_SOAK_REPORT", tmp_path / "soak.json"))
    report.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))
    assert stats.errors == []
    assert stats.completed > NUM_CLIENTS and stats.hang_ups > 0
    assert state["ok"], state["problems"]
    assert state["locked_nodes"] == 0
    assert state["requests"] == {"waiting": 0, "promoting": 0, "running": 0}
    assert sum(figures["disk_page_errors"].values()) == 0
    moved = figures["transfer_bytes"]
    assert moved['transfer_bytes_total{from_tier="host",to_tier="disk"}'] > 0
    assert moved['transfer_bytes_total{from_tier="disk",to_tier="device"}'] > 0
    # bounded: after warm-up, memory does not keep growing (tiers are preallocated)
    assert figures["rss_last_third_max_mib"] <= figures["rss_first_third_max_mib"] + 256
    for messages, text in sample:
        assert text == baseline.answer(messages, MAX_TOKENS)
