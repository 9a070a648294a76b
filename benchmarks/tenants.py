"""`python -m benchmarks.tenants`: one tenant floods, three chat, with fair eviction on and off.

    .venv/bin/python -m benchmarks.tenants [--chats 3] [--turns 6] [--flood-prompts 6] [--reps 3]
                           [--device-cache-size 48MiB] [--host-cache-size 128MiB]
                           [--dtype float32] [--out DIR] [--quick]

It starts two `tieredkv serve` (lpm, device and host tiers, no disk): `fair` with the default
`--namespace-share equal` and `lru` with `--namespace-share 1` (plain LRU across namespaces).
Per rep, from a flushed cache and in the same order on both, each round is:

1. the flooding tenant (a namespace of its own) sends `--flood-prompts` unique long prompts,
   one after the other: together more than the host tier holds;
2. each chatting tenant (a namespace each) sends its next turn: the whole conversation so far,
   with the server's own previous answers, and a new user message.

A chat's history is the only thing a turn can reuse, so the chats' share of prompt tokens served
from the cache (`usage.prompt_tokens_details.cached_tokens`, turns after the first) and their
time to first token show what the flood cost them. The flood's own TTFT (it never hits) is the
price of a miss at its length, measured in the same run. The reps interleave the two servers
(rotated), so load on a shared machine hits both alike; the summary gives medians with min and
max over reps, and TTFTs pooled over reps. With `--dtype float32` (the default: the tier sizes
are chosen for fp32 pages of the default model, 720 KiB each) the sizes hold the workload as
described; with bf16 halve them. `--quick`: tiny sizes for tests (figures meaningless).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from benchmarks.presets import add_server_options, parse_with_preset
from tieredkv.bench.client import ChatClient, served_model
from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.records import RequestRecord, fmt_spread, spread
from tieredkv.bench.result_file import machine_info
from tieredkv.bench.workload import prose, random_question
from tieredkv.errors import TieredKVError

WAYS = {"fair": "equal", "lru": "1"}  # way -> --namespace-share
PRESETS = {
    "default": dict(chats=3, turns=6, chat_words=150, turn_words=40, flood_prompts=6,
                    flood_words=400, max_tokens=4, reps=3, max_model_len=1024,
                    device_cache="48MiB", host_cache="128MiB"),
    "quick": dict(chats=2, turns=3, chat_words=40, turn_words=10, flood_prompts=3,
                  flood_words=150, max_tokens=2, reps=1, max_model_len=256,
                  device_cache="16MiB", host_cache="24MiB"),
}  # fmt: skip


@dataclass
class Turn:
    """One request of a run, as the client saw it."""

    way: str
    rep: int
    tenant: str  # "flood" or "chat<i>"
    round_index: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    cached_by_tier: dict[str, int | None]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.tenants", description=__doc__.split("\n")[0]
    )
    add = p.add_argument
    add("--chats", type=int, help="chatting tenants")
    add("--turns", type=int, help="turns per chat (rounds)")
    add("--chat-words", type=int, help="words of a chat's first message")
    add("--turn-words", type=int, help="words of each later user message")
    add("--flood-prompts", type=int, help="the flooding tenant's prompts per round")
    add("--flood-words", type=int, help="words per flood prompt")
    add("--max-tokens", type=int, help="tokens per answer")
    add("--reps", type=int)
    add("--host-cache-size", dest="host_cache")
    add_server_options(p, dtype="float32")
    return p


def server_args(args: argparse.Namespace, namespace_share: str) -> list[str]:
    return [
        "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
        "--device-cache-size", args.device_cache, "--host-cache-size", args.host_cache,
        "--schedule-policy", "lpm", "--namespace-share", namespace_share, "--debug-endpoints",
    ]  # fmt: skip


def user_message(rng: random.Random, words: int) -> str:
    return f"{prose(rng, words)}\n\n{random_question(rng)}"


def as_turn(record: RequestRecord, way: str, rep: int, tenant: str) -> Turn:
    if record.error or record.ttft_s is None or record.prompt_tokens is None:
        raise TieredKVError(f"{way} {tenant} round {record.round_index}: {record.error}")
    return Turn(
        way,
        rep,
        tenant,
        record.round_index,
        record.ttft_s,
        record.prompt_tokens,
        record.cached_tokens or 0,
        record.cached_by_tier,
    )


async def run_way(
    http: httpx.AsyncClient, base_url: str, way: str, rep: int, args: argparse.Namespace
) -> tuple[list[Turn], dict]:
    """One run from a flushed cache; the turns, and /debug/cache's pages per namespace."""
    (await http.post(base_url + "/v1/cache/flush")).raise_for_status()
    model = await served_model(http, base_url)
    flood = ChatClient(http, base_url, model, {"cache_salt": f"flood-{way}-{rep}"})
    chats = [
        ChatClient(http, base_url, model, {"cache_salt": f"chat{i}-{way}-{rep}"})
        for i in range(args.chats)
    ]
    histories: list[list[dict]] = [[] for _ in chats]
    turns: list[Turn] = []
    for round_index in range(args.turns):
        for j in range(args.flood_prompts):  # the same texts on both ways of a rep
            rng = random.Random(f"flood/{rep}/{round_index}/{j}")
            messages = [{"role": "user", "content": user_message(rng, args.flood_words)}]
            record = await flood.chat(messages, args.max_tokens, 0, round_index)
            turns.append(as_turn(record, way, rep, "flood"))
        for i, (chat, history) in enumerate(zip(chats, histories, strict=True)):
            rng = random.Random(f"chat/{rep}/{i}/{round_index}")
            words = args.chat_words if round_index == 0 else args.turn_words
            history.append({"role": "user", "content": user_message(rng, words)})
            record = await chat.chat(history, args.max_tokens, i, round_index)
            turns.append(as_turn(record, way, rep, f"chat{i}"))
            history.append({"role": "assistant", "content": record.text})
    debug = (await http.get(base_url + "/debug/cache")).json()
    return turns, debug.get("namespaces", {})


async def run_all(servers: dict[str, ManagedServer], args: argparse.Namespace) -> tuple[list, dict]:
    turns: list[Turn] = []
    namespaces: dict[str, list[dict]] = {way: [] for way in servers}
    ways = list(servers)
    async with httpx.AsyncClient(timeout=600) as http:
        for rep in range(args.reps):
            for way in ways[rep % len(ways) :] + ways[: rep % len(ways)]:
                mine, pages = await run_way(http, servers[way].base_url, way, rep, args)
                turns.extend(mine)
                namespaces[way].append(pages)
                chat = [t for t in mine if t.tenant != "flood" and t.round_index]
                print(
                    f"rep {rep} {way:4s} chats' hit ratio {hit_ratio(chat):.2f}  TTFT p50 "
                    f"{statistics.median(t.ttft_s for t in chat) * 1e3:7.0f} ms",
                    file=sys.stderr,
                )
    return turns, namespaces


def hit_ratio(turns: list[Turn]) -> float:
    prompt = sum(t.prompt_tokens for t in turns)
    return sum(t.cached_tokens for t in turns) / prompt if prompt else 0.0


def summary(turns: list[Turn], args: argparse.Namespace) -> str:
    lines = [
        f"{args.chats} chats of {args.turns} turns, {args.flood_prompts} flood prompts of "
        f"~{args.flood_words} words before each round; device {args.device_cache}, host "
        f"{args.host_cache}, {args.dtype}; {args.reps} reps",
        "",
        "| eviction | chats' hit ratio, turns 2+ | chats' TTFT p50 ms, turns 2+ "
        "| chats' TTFT max ms | flood TTFT p50 ms (a miss) | flood hit ratio |",
        "|---|---|---|---|---|---|",
    ]
    for way in WAYS:
        chat = [t for t in turns if t.way == way and t.tenant != "flood" and t.round_index]
        flood = [t for t in turns if t.way == way and t.tenant == "flood"]
        if not chat:
            continue
        per_rep = [hit_ratio([t for t in chat if t.rep == rep]) for rep in range(args.reps)]
        lines.append(
            f"| {way} | {fmt_spread(spread(per_rep), '.2f')} "
            f"| {statistics.median(t.ttft_s for t in chat) * 1e3:,.0f} "
            f"| {max(t.ttft_s for t in chat) * 1e3:,.0f} "
            f"| {statistics.median(t.ttft_s for t in flood) * 1e3:,.0f} "
            f"| {hit_ratio(flood):.2f} |"
        )
    lines += ["", "hit ratio: median (min-max) over reps; TTFT pooled over reps"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = parse_with_preset(build_parser(), argv, PRESETS)
    if min(args.chats, args.turns, args.flood_prompts, args.reps) < 1 or args.turns < 2:
        print("benchmarks/tenants.py: error: --chats, --flood-prompts, --reps >= 1 and "
              "--turns >= 2", file=sys.stderr)  # fmt: skip
        return 2
    out = args.out or Path("bench-results") / time.strftime("tenants-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="tieredkv-tenants-"))
    servers: dict[str, ManagedServer] = {}
    try:
        for way, share in WAYS.items():
            server = ManagedServer(server_args(args, share), work_dir / f"{way}.log", args.threads)
            servers[way] = server
            server.wait_ready()
        turns, namespaces = asyncio.run(run_all(servers, args))
    except (TieredKVError, OSError, httpx.HTTPError) as exc:
        print(f"benchmarks/tenants.py: error: {exc}", file=sys.stderr)
        return 1
    finally:
        for server in servers.values():
            server.stop()
    text = summary(turns, args)
    report = {
        "command": ["python", "-m", "benchmarks.tenants", *argv],
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine_info(),
        "server_args": {way: server_args(args, share) for way, share in WAYS.items()},
        "turns": [asdict(t) for t in turns],
        "namespace_pages_at_end": namespaces,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "summary.md").write_text(text)
    print(text)
    print(f"report: {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
