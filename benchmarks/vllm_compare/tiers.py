"""tieredkv alone: a cache hit's time by the tier it comes from.

Histories of 3k tokens are sent, the server is restarted (its disk index rebuilt, the store
dropped from the page cache), and the next turn of each history is timed with the history on
disk, then another turn with it already on the device, then the same turn recomputed (a fresh
`cache_salt`). The rule: TTFT with the history on disk <= TTFT with it on the device + 1.5 x
(bytes / disk read bandwidth).

The rule's bytes are what the client knows: the history's tokens floored to whole pages, times
the page's bytes (the model's config and the page layout). The server's own count of disk
tokens (`cached_tokens_by_tier`) is only cross-checked: a disagreement is recorded, never used.
The bandwidth is measured in the same run (`disk_check.disk_read_limit`: the store's request
sizes and requests in flight), before and after the turns; the faster of the two is the limit
(this shared disk's speed drifts within minutes, and the faster probe is the stricter rule).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import torch

from benchmarks.machine_load import OtherLoad
from benchmarks.vllm_compare.client import Prompts, stream
from tieredkv.bench.disk_check import disk_read_limit, drop_page_cache
from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.prom_text import Samples, counter_delta, parse_samples, select
from tieredkv.cache.page_layout import PageLayout
from tieredkv.model.default_model import default_model_dir
from tieredkv.model.hf_config import parse_model_config, read_config_json

TIER_HISTORY_TOKENS = 3072
QUESTION_TOKENS = 64
PAGE_SIZE = 16
MAX_MODEL_LEN = 8192
DISK_SLACK = 1.5  # the rule: on disk <= on device + DISK_SLACK x the ideal read


def page_layout(dtype: torch.dtype = torch.bfloat16) -> PageLayout:
    model_dir = default_model_dir()
    config = parse_model_config(read_config_json(model_dir), model_dir)
    return PageLayout.for_model(config, PAGE_SIZE, dtype)


def history_bytes(history_tokens: int, layout: PageLayout) -> int:
    """The bytes a history's reuse reads: its tokens floored to whole pages."""
    return history_tokens // layout.page_size * layout.page_bytes


async def metrics(http: httpx.AsyncClient, url: str) -> Samples:
    return parse_samples((await http.get(url + "/metrics")).text)


async def settled_metrics(http: httpx.AsyncClient, url: str) -> Samples:
    """/metrics once the engine is idle: the engine thread mirrors the cache's counters at the
    end of a step, after the step's tokens went out, so a scrape right after the first token
    can miss that step's transfers. Two equal scrapes 20 ms apart (at most 2 s of trying)."""
    last = await metrics(http, url)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        now = await metrics(http, url)
        if now == last:
            break
        last = now
    return last


def server_split(before: Samples, after: Samples, ttft_s: float) -> dict:
    """Where one request's TTFT went, by the server's own sums: waiting (arrival to first
    forward, which includes the promotion), the promotion itself, and the rest (the forward)."""
    queue = counter_delta(before, after, "tieredkv_queue_seconds_sum") or 0.0
    promotion = counter_delta(before, after, "tieredkv_promotion_seconds_sum") or 0.0
    return {"queue_s": queue, "promotion_s": promotion, "after_queue_s": ttft_s - queue}


async def send_histories(url: str, histories: list[list[int]], layout: PageLayout) -> None:
    """Compute every history once, then wait until write-through has put it all on disk."""
    async with httpx.AsyncClient(timeout=600) as http:
        model = (await http.get(url + "/v1/models")).json()["data"][0]["id"]
        for history in histories:
            await stream(http, url, model, history, 1)
        wanted = sum(history_bytes(len(h), layout) for h in histories)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            samples = await metrics(http, url)
            written = select(samples, "tieredkv_transfer_bytes_total", to_tier="disk")
            if sum(written.values()) >= wanted:
                break
            await asyncio.sleep(0.2)


async def turn_on(http: httpx.AsyncClient, url: str, model: str, turn: list[int], pid: int):
    """One timed turn: its stream, the cores others took, and /metrics before and after."""
    before = await settled_metrics(http, url)
    with OtherLoad([pid]) as load:
        result = await stream(http, url, model, turn, 1)
    after = await settled_metrics(http, url)
    return result, load, before, after


async def turns_by_tier(
    url: str, histories: list[list[int]], prompts: Prompts, pid: int
) -> list[dict]:
    """Per history: a turn with it on disk, one with it on the device, one recomputed."""
    rows = []
    async with httpx.AsyncClient(timeout=600) as http:
        model = (await http.get(url + "/v1/models")).json()["data"][0]["id"]
        # a fresh server's first long request pays one-time costs (first-touch buffers): an
        # unrelated prompt of the same shape pays them, not the first history
        await stream(http, url, model, prompts.fresh(TIER_HISTORY_TOKENS + QUESTION_TOKENS), 1)
        for i, history in enumerate(histories):
            turn = history + prompts.fresh(QUESTION_TOKENS)
            disk, disk_load, before, after = await turn_on(http, url, model, turn, pid)
            next_turn = history + prompts.fresh(QUESTION_TOKENS)
            device, device_load, _, after_device = await turn_on(http, url, model, next_turn, pid)
            recomputed = await stream(http, url, model, turn, 1, salt=f"recompute-{i}")
            read = counter_delta(before, after, "tieredkv_transfer_bytes_total", from_tier="disk")
            rows.append(
                {
                    "history_tokens": len(history),
                    "disk_ttft_s": disk["ttft_s"],
                    "device_ttft_s": device["ttft_s"],
                    "recompute_ttft_s": recomputed["ttft_s"],
                    "disk_cached_by_tier": disk["usage"]["prompt_tokens_details"][
                        "cached_tokens_by_tier"
                    ],
                    "device_cached_by_tier": device["usage"]["prompt_tokens_details"][
                        "cached_tokens_by_tier"
                    ],
                    "disk_bytes_read": read or 0.0,
                    "disk_split": server_split(before, after, disk["ttft_s"]),
                    "device_split": server_split(after, after_device, device["ttft_s"]),
                    "disk_others_cores": disk_load.others_cores,
                    "device_others_cores": device_load.others_cores,
                    "disk_steal_cores": disk_load.steal_cores,
                    "device_steal_cores": device_load.steal_cores,
                }
            )
    return rows


def judge(row: dict, layout: PageLayout, bytes_per_s: float) -> dict:
    """The disk rule for one turn, from the client's bytes; the server's count cross-checked."""
    disk_bytes = history_bytes(row["history_tokens"], layout)
    expected_tokens = row["history_tokens"] // layout.page_size * layout.page_size
    read_ideal_s = disk_bytes / bytes_per_s
    bound_s = row["device_ttft_s"] + DISK_SLACK * read_ideal_s
    server_tokens = row["disk_cached_by_tier"].get("disk")
    return {
        **row,
        "disk_bytes": disk_bytes,
        "read_ideal_s": read_ideal_s,
        "bound_s": bound_s,
        "met": row["disk_ttft_s"] <= bound_s,
        "server_disk_tokens": server_tokens,
        "server_count_matches": server_tokens == expected_tokens,
    }


def print_turn(row: dict) -> None:
    ms = {key: row[key] * 1000 for key in ("disk_ttft_s", "device_ttft_s", "recompute_ttft_s")}
    print(
        f"  history on disk {ms['disk_ttft_s']:.0f} ms, on device {ms['device_ttft_s']:.0f} ms, "
        f"recomputed {ms['recompute_ttft_s']:.0f} ms; bound {row['bound_s'] * 1000:.0f} ms: "
        f"{'met' if row['met'] else 'NOT met'}; server's disk tokens {row['server_disk_tokens']}"
        f"{'' if row['server_count_matches'] else ' (MISMATCH with the client count)'}",
        flush=True,
    )


def measure_tiers(out: Path, prompts: Prompts, repeats: int) -> dict:
    disk_dir = out / "kv"
    serve_args = ["--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN)]
    serve_args += ["--device-cache-size", "1GiB", "--host-cache-size", "1GiB"]
    serve_args += ["--disk-cache-dir", str(disk_dir), "--disk-cache-size", "4GiB"]
    layout = page_layout()
    histories = [prompts.fresh(TIER_HISTORY_TOKENS) for _ in range(repeats)]
    with ManagedServer(serve_args, out / "tieredkv-tiers-1.log") as server:
        asyncio.run(send_histories(server.base_url, histories, layout))
    before = disk_read_limit(out)
    with ManagedServer(serve_args, out / "tieredkv-tiers-2.log") as server:
        drop_page_cache(disk_dir)
        rows = asyncio.run(turns_by_tier(server.base_url, histories, prompts, server.process.pid))
    after = disk_read_limit(out)
    shutil.rmtree(disk_dir)  # a preallocated 4 GiB store: a few runs would fill the disk
    bandwidth = max(before, after, key=lambda probe: probe["bytes_per_s"])
    bandwidth = {**bandwidth, "probes_bytes_per_s": [before["bytes_per_s"], after["bytes_per_s"]]}
    print(
        f"  disk read limit: {before['bytes_per_s'] / 1e9:.2f} GB/s before the turns, "
        f"{after['bytes_per_s'] / 1e9:.2f} after",
        flush=True,
    )
    turns = [judge(row, layout, bandwidth["bytes_per_s"]) for row in rows]
    for turn in turns:
        print_turn(turn)
    return {"disk_read": bandwidth, "turns": turns, "page_bytes": layout.page_bytes}
