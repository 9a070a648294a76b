"""Many users' long chats whose histories together are several times a 1 GiB KV budget,
round-robin, three rounds; TTFT of the reuse rounds (2 and 3) from per-request timings.

Three servers: tieredkv with 1 GiB of RAM for KV (768 MiB device + 256 MiB host) and a disk
tier; vLLM with the same 1 GiB of KV; and vLLM with KV space for the whole working set (every
chat's final history, from the client's own token counts and the model's bytes per token,
rounded up to whole GiB, as vLLM takes it). The question the rows answer: how much RAM each
needs for the same TTFT. Each server's peak memory is measured beside it.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.vllm_compare.peers import TreeMemory, VllmServer, process_settings
from benchmarks.vllm_compare.tiers import page_layout
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.records import percentile
from tieredkv.bench.workload import Workload, WorkloadConfig
from tieredkv.bench.workload_run import run_workload
from tieredkv.model.default_model import default_model_dir
from tieredkv.model.tokenizer import ChatTokenizer

OVERFLOW_USERS = 48  # ~80 MB of bf16 KV each by round 3: ~3.7x a 1 GiB budget
OVERFLOW_MAX_MODEL_LEN = 4096
OURS_RAM = ("768MiB", "256MiB")  # device, host: 1 GiB of RAM for KV
OURS_DISK = "8GiB"
PEER_KV_GIB = 1


def overflow_workload(seed: int, users: int = OVERFLOW_USERS) -> Workload:
    return Workload(WorkloadConfig(users, 3, 150, 2400, 32, seed))


def working_set_tokens(workload: Workload) -> int:
    """Every chat's final history in tokens, whole pages each: the last round's prompt with
    each answer counted at max_tokens, plus its own answer (an upper bound)."""
    config = workload.config
    tokenizer = ChatTokenizer(default_model_dir())
    page_size = page_layout().page_size
    total = 0
    for user in range(config.num_users):
        messages = workload.messages(user, [""] * (config.num_rounds - 1))
        tokens = (
            len(tokenizer.apply_chat_template(messages)) + config.num_rounds * config.max_tokens
        )
        total += -(-tokens // page_size) * page_size
    return total


def working_set_gib(workload: Workload) -> tuple[int, int]:
    """(working set bytes, KV space in whole GiB that holds it)."""
    layout = page_layout()
    num_bytes = working_set_tokens(workload) * layout.page_bytes // layout.page_size
    return num_bytes, math.ceil(num_bytes / 2**30)


def overflow_run(url: str, label: str, workload: Workload) -> tuple[dict, list[dict]]:
    run = run_workload(url, workload, ArrivalConfig(1, None), label=label)
    reuse = [r for r in run["records"] if r["round_index"] >= 1 and r["ttft_s"] is not None]
    ttfts = [r["ttft_s"] for r in reuse]
    summary = {
        "requests": len(reuse),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "hit_ratio": run["summary"]["reuse_rounds"]["hit_ratio"],
        "round1_ttft_p50_s": run["summary"]["by_round"][0]["ttft_s"]["p50"],
    }
    print(
        f"  overflow ({label}): reuse-round TTFT p50 {summary['ttft_p50_s'] * 1000:.0f} ms over"
        f" {len(reuse)} requests, hit ratio {summary['hit_ratio']}",
        flush=True,
    )
    keys = ("user", "round_index", "prompt_tokens", "output_tokens", "ttft_s", "cached_tokens")
    records = [
        {
            "server": label,
            "section": "overflow",
            **{key: r[key] for key in keys},
            "cached_by_tier": r["cached_by_tier"],
            "error": r["error"],
        }
        for r in run["records"]
    ]
    return summary, records


def run_ours(work_dir: Path, workload: Workload, extra_args: list[str]) -> tuple[dict, list[dict]]:
    store = work_dir / "kv-overflow"
    args = ["--dtype", "bfloat16", "--max-model-len", str(OVERFLOW_MAX_MODEL_LEN)]
    args += ["--device-cache-size", OURS_RAM[0], "--host-cache-size", OURS_RAM[1]]
    args += ["--disk-cache-dir", str(store), "--disk-cache-size", OURS_DISK, *extra_args]
    with (
        ManagedServer(args, work_dir / "tieredkv-overflow.log") as server,
        TreeMemory(server.process.pid) as memory,
    ):
        summary, records = overflow_run(server.base_url, "tieredkv", workload)
    summary.update(memory.result(), kv_ram=" + ".join(OURS_RAM), disk=OURS_DISK)
    return summary, records


def run_peer(
    work_dir: Path, workload: Workload, kv_gib: int, label: str
) -> tuple[dict, list[dict]]:
    log = work_dir / f"{label}-overflow.log"
    with (
        VllmServer(kv_gib, OVERFLOW_MAX_MODEL_LEN, log) as server,
        TreeMemory(server.process.pid) as memory,
    ):
        settings = process_settings(server.process.pid)
        summary, records = overflow_run(server.base_url, label, workload)
    summary.update(memory.result(), kv_gib=kv_gib, settings=settings)
    return summary, records
