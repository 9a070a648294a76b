"""The figures a user feels through the HTTP API, for one server: cold prefill, warm turns and
decode, each the median of `repeats` fresh prompts with min and max, and beside it the most cores
other processes took during any of its samples (`OtherLoad`).

- cold prefill: a prompt no server has seen, max_tokens=1; tokens / TTFT
- warm turn: a history sent once, then history + a new 64-token question; the second TTFT, and
  the cached tokens the server reports for it
- decode: one stream at ~2.7k tokens of context, and 8 concurrent streams at ~1k, 256 tokens
  each, timed over the window in which every stream is decoding (see `client.decode_window`)

Before each section one untimed request of the section's shape warms the server up. Every
sample is also returned as a record (server, section, prompt length, TTFT, tokens, cached
tokens, others' cores) for the raw result.
"""

from __future__ import annotations

import asyncio
import statistics

import httpx

from benchmarks.machine_load import OtherLoad
from benchmarks.vllm_compare.client import Prompts, cached_tokens, decode_window, stream

PREFILL_LENGTHS = (2048, 8000)
HISTORY_LENGTHS = (1024, 2048, 4096, 7500)
QUESTION_TOKENS = 64
DECODE_TOKENS = 256
DECODE_SHAPES = ((1, 2700), (8, 1024))  # (streams, context tokens)
FIGURE_SECTIONS = ("prefill", "warm", "decode")


def spread(values: list[float], others: list[float | None] | None = None) -> dict:
    """Median, min and max of `values`; with `others` (each sample's
    `OtherLoad.others_cores`), the most cores the rest of the machine took during any of them."""
    result = {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }
    known = [cores for cores in others or () if cores is not None]
    if known:
        result["others_cores_max"] = max(known)
    return result


class FigureRun:
    """One server's figures and the records behind them."""

    def __init__(self, http: httpx.AsyncClient, url: str, model: str, server: str, pid: int):
        self.http, self.url, self.model, self.server, self.pid = http, url, model, server, pid
        self.records: list[dict] = []

    def record(self, section: str, load: OtherLoad, **fields: object) -> None:
        others = load.others_cores
        self.records.append(
            {"server": self.server, "section": section, **fields, "others_cores": others}
        )

    async def prefill(self, prompts: Prompts, repeats: int) -> dict:
        figures = {}
        for length in PREFILL_LENGTHS:
            await stream(self.http, self.url, self.model, prompts.fresh(length), 1)  # warm-up
            speeds, others = [], []
            for _ in range(repeats):
                with OtherLoad([self.pid]) as load:
                    result = await stream(self.http, self.url, self.model, prompts.fresh(length), 1)
                speeds.append(length / result["ttft_s"])
                others.append(load.others_cores)
                self.record(
                    "prefill",
                    load,
                    prompt_tokens=length,
                    ttft_s=result["ttft_s"],
                    tokens=result["tokens"],
                    cached_tokens=cached_tokens(result),
                )
            figures[length] = spread(speeds, others)
            print(f"  cold prefill {length}: {statistics.median(speeds):.0f} tok/s", flush=True)
        return figures

    async def warm(self, prompts: Prompts, repeats: int) -> dict:
        figures = {}
        for length in HISTORY_LENGTHS:
            ttfts, cached, others = [], [], []
            for repeat in range(repeats + 1):  # the first is a warm-up
                history = prompts.fresh(length)
                await stream(self.http, self.url, self.model, history, 1)
                turn = history + prompts.fresh(QUESTION_TOKENS)
                with OtherLoad([self.pid]) as load:
                    result = await stream(self.http, self.url, self.model, turn, 1)
                if repeat == 0:
                    continue
                ttfts.append(result["ttft_s"])
                others.append(load.others_cores)
                cached.append(cached_tokens(result))
                self.record(
                    "warm",
                    load,
                    prompt_tokens=len(turn),
                    ttft_s=result["ttft_s"],
                    tokens=result["tokens"],
                    cached_tokens=cached[-1],
                )
            figures[length] = {**spread(ttfts, others), "cached_tokens": cached}
            print(
                f"  warm turn {length}: {statistics.median(ttfts) * 1000:.0f} ms, "
                f"cached tokens {cached}",
                flush=True,
            )
        return figures

    async def decode(self, prompts: Prompts, repeats: int) -> dict:
        figures = {}
        for streams, context in DECODE_SHAPES:
            per_token, throughput, others = [], [], []
            for repeat in range(repeats + 1):  # the first is a warm-up
                with OtherLoad([self.pid]) as load:  # the prefills too: a close bound
                    results = await asyncio.gather(
                        *(
                            stream(
                                self.http,
                                self.url,
                                self.model,
                                prompts.fresh(context),
                                DECODE_TOKENS,
                                token_ids=True,
                            )
                            for _ in range(streams)
                        )
                    )
                if repeat == 0:
                    continue
                ms_per_token, tokens_per_s = decode_window(results)
                per_token.append(ms_per_token)
                throughput.append(tokens_per_s)
                others.append(load.others_cores)
                self.record(
                    "decode",
                    load,
                    streams=streams,
                    prompt_tokens=context,
                    tokens=sum(r["tokens"] for r in results),
                    chunks=sum(len(r["chunk_tokens"]) for r in results),
                    ms_per_token=ms_per_token,
                    tokens_per_s=tokens_per_s,
                )
            figures[streams] = {
                "context_tokens": context,
                "ms_per_token": spread(per_token, others),
                "tokens_per_s": spread(throughput, others),
            }
            print(
                f"  decode x{streams}: {statistics.median(per_token):.1f} ms/token, "
                f"{statistics.median(throughput):.1f} tok/s",
                flush=True,
            )
        return figures


async def measure(
    url: str, prompts: Prompts, repeats: int, server: str, pid: int, sections: set[str]
) -> tuple[dict, list[dict]]:
    """The `sections` (of FIGURE_SECTIONS) for the server at `url`, and their records."""
    async with httpx.AsyncClient(timeout=600) as http:
        model = (await http.get(url + "/v1/models")).json()["data"][0]["id"]
        await stream(http, url, model, prompts.fresh(256), 4)  # warm-up
        run = FigureRun(http, url, model, server, pid)
        figures: dict = {}
        if "prefill" in sections:
            figures["prefill_tok_per_s"] = await run.prefill(prompts, repeats)
        if "warm" in sections:
            figures["warm_ttft_s"] = await run.warm(prompts, repeats)
        if "decode" in sections:
            figures["decode"] = await run.decode(prompts, repeats)
        return figures, run.records
