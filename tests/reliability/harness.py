"""What the reliability tests share: a server process behind the fault-injecting launcher, the
chats they send, the no-cache answers they compare against, /metrics parsing, and an
independent reader of the disk store file (it trusts nothing the server says)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from tests.integration.server_process import ServerProcess, free_port
from tieredkv.cache.disk.directory import STORE_FILE
from tieredkv.cache.disk.format import (
    SUPERBLOCK_BYTES,
    RecordHeader,
    chain_ok,
    decode_header,
    decode_superblock,
    payload_ok,
)

REPO = Path(__file__).resolve().parents[2]
MODEL = "SmolLM2-135M-Instruct"
PAGE_BYTES = 737_280  # fp32 pages of the default model, 16 tokens
# Tiny tiers: the device holds one 512-token sequence plus a little (34 pages), the host 11
# pages, so a few ~250-token chats push pages down to disk at once.
COMMON = ["--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "4"]
TINY_TIERS = ["--device-cache-size", "24MiB", "--host-cache-size", "8MiB"]
WORDS = [
    *("river", "stone", "lantern", "orbit", "meadow", "copper", "signal", "harbor"),
    *("violet", "engine", "canyon", "whisper", "glacier", "pixel", "thunder", "archive"),
    *("compass", "ember", "falcon", "mosaic", "nebula", "quartz", "saddle", "tide"),
]


def document(seed: int, num_words: int) -> str:
    """Deterministic filler text, different per seed."""
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(num_words))


def opening(seed: int, num_words: int = 180) -> list[dict]:
    """The first turn of a chat about its own document (~250 prompt tokens at 180 words)."""
    return [{"role": "user", "content": f"Document {seed}:\n{document(seed, num_words)}\nSum up."}]


def follow_up(messages: list[dict], answer: str, question: str = "And then?") -> list[dict]:
    turn = [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]
    return [*messages, *turn]


def disk_args(directory: Path, size: str = "64MiB") -> list[str]:
    return ["--disk-cache-dir", str(directory), "--disk-cache-size", size]


class FaultServer(ServerProcess):
    """`tieredkv serve` through tests/reliability/fault_server.py with `faults` (its TKV_FAULTS)."""

    root: Path | None = None  # where a fixture keeps this server's files

    def __init__(
        self, args: list[str], log_path: Path, faults: dict | None = None, wait: bool = True
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [sys.executable, "-m", "tests.reliability.fault_server", "serve"]
        command += ["--port", str(self.port), *args]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
            "TKV_FAULTS": json.dumps(faults or {}),
        }
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO
        )
        if wait:
            self._wait_healthy()

    def kill(self) -> None:
        """kill -9 and reap."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self._log.close()

    def wait_dead(self, timeout: float = 60.0) -> int:
        code = self.process.wait(timeout)
        self._log.close()
        return code

    def full_log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def post(self, path: str, body: dict, timeout: float = 120.0, **kw) -> httpx.Response:
        return httpx.post(self.base_url + path, json=body, timeout=timeout, **kw)

    def chat(self, messages: list[dict], max_tokens: int = 8, **extra) -> dict:
        """A greedy non-streamed chat; asserts 200; returns the JSON body."""
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        response = self.post("/v1/chat/completions", {**body, **extra})
        assert response.status_code == 200, response.text
        return response.json()

    def metrics(self) -> dict[str, float]:
        """`/metrics` as {"name{labels}": value}."""
        text = httpx.get(self.base_url + "/metrics", timeout=30).text
        return parse_metrics(text)

    def health(self) -> tuple[int, dict]:
        response = httpx.get(self.base_url + "/health", timeout=30)
        return response.status_code, response.json()

    def debug_cache(self, headers: dict | None = None) -> dict:
        response = httpx.get(self.base_url + "/debug/cache", timeout=60, headers=headers)
        assert response.status_code == 200, response.text
        return response.json()

    def rss_bytes(self, field: str = "VmRSS") -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
        assert match, status
        return int(match.group(1)) * 1024


def disk_read_bytes(metrics: dict[str, float]) -> float:
    """Bytes read back from the disk tier (towards host or device)."""
    return sum(
        metrics[f'transfer_bytes_total{{from_tier="disk",to_tier="{tier}"}}']
        for tier in ("host", "device")
    )


def parse_metrics(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.removeprefix("tieredkv_")] = float(value)
    return values


def answer(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def cached_by_tier(reply: dict) -> dict[str, int]:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]


class Baseline:
    """A `--no-cache` server's greedy answers, memoized by request."""

    def __init__(self, server: FaultServer) -> None:
        self.server = server
        self._answers: dict[str, str] = {}

    def answer(self, messages: list[dict], max_tokens: int = 8) -> str:
        key = json.dumps([messages, max_tokens])
        if key not in self._answers:
            reply = self.server.chat(messages, max_tokens)
            assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            self._answers[key] = answer(reply)
        return self._answers[key]


def run_chats(server: FaultServer, seeds: list[int], turns: int = 2) -> list[list[dict]]:
    """Each seed's chat for `turns` turns (sequential, greedy); returns each chat's messages up
    to (and including) its last question."""
    chats = []
    for seed in seeds:
        messages = opening(seed)
        for turn in range(turns):
            reply = server.chat(messages)
            messages = follow_up(messages, answer(reply), f"Question {turn}: and then?")
        chats.append(messages)
    return chats


def assert_answers_like_baseline(
    server: FaultServer, baseline: Baseline, chats: list[list[dict]]
) -> dict[str, int]:
    """Every chat's next turn on `server` equals the no-cache answer; returns the cached tokens
    per tier summed over the chats."""
    totals = {"device": 0, "host": 0, "disk": 0, "remote": 0}
    for messages in chats:
        reply = server.chat(messages)
        assert answer(reply) == baseline.answer(messages), messages[-1]
        for tier, tokens in cached_by_tier(reply).items():
            totals[tier] += tokens
    return totals


@dataclass
class StoreScan:
    """What the store file holds, read independently of the server."""

    num_slots: int
    header_bytes: int
    payload_offset: int
    record_bytes: int
    live: dict[int, RecordHeader]  # header and payload verified
    bad_headers: list[int]  # non-zero headers that do not verify or chain
    bad_payloads: list[int]  # headers that verify over a payload that does not


def scan_store(directory: Path, page_size: int = 16) -> StoreScan:
    data = (directory / STORE_FILE).read_bytes()
    block = decode_superblock(data[:SUPERBLOCK_BYTES])
    live, bad_headers, bad_payloads = {}, [], []
    for slot in range(block.num_slots):
        start = SUPERBLOCK_BYTES + slot * block.header_bytes
        raw = data[start : start + block.header_bytes]
        if not any(raw):
            continue
        header = decode_header(raw, page_size)
        if header is None or not chain_ok(header):
            bad_headers.append(slot)
            continue
        offset = block.payload_offset + slot * block.record_bytes
        payload = memoryview(data)[offset : offset + header.payload_len]
        if len(payload) != header.payload_len or not payload_ok(header, payload):
            bad_payloads.append(slot)
        else:
            live[slot] = header
    return StoreScan(
        block.num_slots,
        block.header_bytes,
        block.payload_offset,
        block.record_bytes,
        live,
        bad_headers,
        bad_payloads,
    )


def reachable_from_prompt_start(scan: StoreScan, first_token: int) -> set[int]:
    """Live slots chained to a record that begins a prompt (its first token is `first_token`
    and its parent is no record): the pages a restarted server can match. Others are orphans
    whose parent's write did not complete."""
    keys = {header.key for header in scan.live.values()}
    children: dict[bytes, list[int]] = {}
    for slot, header in scan.live.items():
        children.setdefault(header.parent_key, []).append(slot)
    stack = [
        slot
        for slot, header in scan.live.items()
        if header.parent_key not in keys and header.tokens[0] == first_token
    ]
    reached: set[int] = set()
    while stack:
        slot = stack.pop()
        reached.add(slot)
        stack.extend(children.get(scan.live[slot].key, []))
    return reached


def slots_from_write_log(log: Path, scan: StoreScan) -> tuple[set[int], set[int]]:
    """From the launcher's header-write log: (slots whose latest completed header write holds
    a record, slots whose header write had started but not been logged done at the end)."""
    live: dict[int, bool] = {}
    started: dict[int, bool] = {}
    for line in log.read_text().splitlines():
        event, offset, num_bytes, state = line.split()
        first = (int(offset) - SUPERBLOCK_BYTES) // scan.header_bytes
        for slot in range(first, first + int(num_bytes) // scan.header_bytes):
            if event == "start":
                started[slot] = state == "data"
            else:
                live[slot] = started.pop(slot)
    completed = {slot for slot, written in live.items() if written and slot not in started}
    return completed, set(started)


def live_slots_from_write_log(log: Path, scan: StoreScan) -> set[int]:
    """Slots whose latest header write holds a record, every write logged done."""
    completed, in_flight = slots_from_write_log(log, scan)
    assert not in_flight, f"header writes never completed: {sorted(in_flight)}"
    return completed


def flip_bytes(path: Path, offset: int, count: int = 1) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        old = np.frombuffer(file.read(count), dtype=np.uint8)
        file.seek(offset)
        file.write((old ^ 0xFF).tobytes())


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.1) -> bool:
    """Test code: poll another process's state until `predicate()` or `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
