"""Drive the workload against one server: round-robin over users (every other user's turn
comes between two turns of the same conversation: the largest reuse distance) or Poisson
arrivals at a given rate, with at most `concurrency` requests in flight.

Round-robin runs round by round: round r+1 starts when round r is done, and `before_round(r)`
runs in between (the benchmark drops the disk store from the page cache there). With Poisson
arrivals, request i is released at its arrival time but also waits for its own conversation's
previous answer; its TTFT is measured from when it is sent.

`before_turn(round, user)` runs before every turn, once the turn holds its place among the
`concurrency` in flight (with one in flight, every earlier turn is done), on a worker thread:
turns already in flight carry on while it runs (benchmarks/replicas.py restarts a replica
there), and the turn's TTFT is measured from when it is sent, after the hook.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable

from tqdm import tqdm

from tieredkv.bench.client import ChatClient
from tieredkv.bench.records import RequestRecord
from tieredkv.bench.workload import Workload
from tieredkv.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ArrivalConfig:
    """`rate_per_s` None: round-robin; else Poisson arrivals at that mean rate."""

    concurrency: int = 1
    rate_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency <= 0:
            raise ConfigError(f"ArrivalConfig.concurrency must be > 0, got {self.concurrency}")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ConfigError(f"ArrivalConfig.rate_per_s must be > 0, got {self.rate_per_s}")


class WorkloadDriver:
    """Runs every conversation of `workload` through `client`; records every request."""

    def __init__(
        self,
        workload: Workload,
        client: ChatClient,
        arrival: ArrivalConfig,
        before_round: Callable[[int], None] | None = None,
        label: str = "",
        before_turn: Callable[[int, int], None] | None = None,
    ) -> None:
        self.workload = workload
        self.client = client
        self.arrival = arrival
        self.before_round = before_round or (lambda _round: None)
        self.before_turn = before_turn
        self.label = label
        cfg = workload.config
        self.answers: list[list[str]] = [[] for _ in range(cfg.num_users)]
        self.records: list[RequestRecord] = []
        self._slots = asyncio.Semaphore(arrival.concurrency)
        self._bar = tqdm(total=cfg.num_users * cfg.num_rounds, desc=label or "requests", unit="req")

    async def run(self) -> list[RequestRecord]:
        try:
            if self.arrival.rate_per_s is None:
                await self._round_robin()
            else:
                await self._poisson(self.arrival.rate_per_s)
        finally:
            self._bar.close()
        return sorted(self.records, key=lambda r: (r.round_index, r.user))

    async def _round_robin(self) -> None:
        for round_index in range(self.workload.config.num_rounds):
            self.before_round(round_index)
            users = range(self.workload.config.num_users)
            await asyncio.gather(*(self._turn(user, round_index) for user in users))

    async def _poisson(self, rate_per_s: float) -> None:
        cfg = self.workload.config
        rng = random.Random(f"{cfg.seed}/arrivals")
        self.before_round(0)
        start = time.perf_counter()
        previous: list[asyncio.Task | None] = [None] * cfg.num_users
        tasks = []
        arrival_s = 0.0
        for round_index in range(cfg.num_rounds):
            for user in range(cfg.num_users):
                arrival_s += rng.expovariate(rate_per_s)
                task = asyncio.create_task(
                    self._arrive(start + arrival_s, previous[user], user, round_index)
                )
                previous[user] = task
                tasks.append(task)
        await asyncio.gather(*tasks)

    async def _arrive(
        self, at: float, after: asyncio.Task | None, user: int, round_index: int
    ) -> None:
        await asyncio.sleep(max(at - time.perf_counter(), 0.0))
        if after is not None:
            await after
        await self._turn(user, round_index)

    async def _turn(self, user: int, round_index: int) -> None:
        messages = self.workload.messages(user, self.answers[user])
        async with self._slots:
            if self.before_turn is not None:
                await asyncio.to_thread(self.before_turn, round_index, user)
            record = await self.client.chat(
                messages, self.workload.config.max_tokens, user, round_index
            )
        # a failed turn still continues the conversation, with an empty answer
        self.answers[user].append(record.text)
        self.records.append(record)
        self._bar.update(1)
        if not record.ok:
            self._bar.write(f"user {user} round {round_index}: {record.error}")
