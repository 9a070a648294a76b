"""NVIDIA Dynamo's KV router (benchmarks/dynamo_router.py, under the router's own Python) as
child processes over tieredkv replicas that publish KV events: one relaying worker per replica,
then the router, all sharing a fresh discovery folder. `route` asks the router which replica a
prompt's token ids should go to; `done` tells it the request finished (its load tracking)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

from tieredkv.bench.managed import free_port
from tieredkv.errors import TieredKVError

ROUTER_VENV = Path(
    os.environ.get("ROUTER_VENV", Path(__file__).resolve().parent.parent / ".venv-router")
)
SCRIPT = Path(__file__).resolve().parent / "dynamo_router.py"
READY_S = 60.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.2  # between two reads of the router's worker list


class DynamoMissingError(TieredKVError):
    """The router's venv (benchmarks/dynamo_router.sh install) is not there."""


class DynamoStartError(TieredKVError):
    """A worker or the router exited, or the router never saw every worker."""


class DynamoRouteError(TieredKVError):
    """The router answered a request with an error."""


def require_dynamo() -> Path:
    """The router venv's python, or DynamoMissingError saying how to make it."""
    python = ROUTER_VENV / "bin" / "python"
    if not python.is_file():
        raise DynamoMissingError(
            f"{python} not found: run benchmarks/dynamo_router.sh install (ROUTER_VENV sets where)"
        )
    return python


def dynamo_version() -> str:
    """The version of `ai-dynamo-runtime` in the router's venv."""
    code = "from importlib.metadata import version; print(version('ai-dynamo-runtime'))"
    done = subprocess.run([str(require_dynamo()), "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


class DynamoRouter:
    """Dynamo's router over the replicas whose KV events are published at `kv_events` (one
    ZMQ endpoint per replica, in replica order), with pages of `page_size` tokens; logs and
    the discovery folder under `work_dir`. Use as a context manager."""

    def __init__(self, kv_events: list[str], page_size: int, work_dir: Path) -> None:
        self.kv_events = list(kv_events)
        self.page_size = page_size
        self.work_dir = work_dir
        self.port = free_port()
        self.processes: list[subprocess.Popen] = []
        self.worker_ids: list[int] = []  # worker_ids[i]: replica i's Dynamo worker

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        env = {**os.environ, "DYN_FILE_KV": str(self.work_dir / "discovery")}
        log = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it
        command = [str(require_dynamo()), str(SCRIPT), *args, "--page-size", str(self.page_size)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=env)
        log.close()
        self.processes.append(process)
        return process

    def _first_line(self, process: subprocess.Popen, name: str) -> dict:
        line = process.stdout.readline()  # SYNC: the child's ready line (EOF if it exits)
        if not line:
            log = (self.work_dir / f"{name}.log").read_text(errors="replace")[-3000:]
            raise DynamoStartError(f"dynamo {name} exited before it was ready:\n{log}")
        return json.loads(line)

    def start(self) -> DynamoRouter:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            workers = [
                self._spawn(f"dynamo-worker{i}", ["worker", "--kv-events", endpoint])
                for i, endpoint in enumerate(self.kv_events)
            ]
            for i, process in enumerate(workers):
                self.worker_ids.append(self._first_line(process, f"dynamo-worker{i}")["worker_id"])
            router = self._spawn("dynamo-router", ["router", "--port", str(self.port)])
            self._first_line(router, "dynamo-router")
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            seen = {row["worker_id"] for row in asyncio.run(self.scores([0]))["workers"]}
            if seen == set(self.worker_ids):
                return
            time.sleep(POLL_S)  # the router discovers workers through files, in its own process
        raise DynamoStartError(f"the router never saw workers {self.worker_ids}")

    async def _ask(self, request: dict) -> dict:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(json.dumps(request).encode() + b"\n")
        await writer.drain()
        reply = json.loads(await reader.readline())
        writer.close()
        if "error" in reply:
            raise DynamoRouteError(f"the router answered {request['op']}: {reply['error']}")
        return reply

    async def route(self, token_ids: list[int], request_id: str) -> tuple[int, int]:
        """(replica index, pages of the prompt the router found cached there)."""
        reply = await self._ask({"op": "route", "token_ids": token_ids, "request_id": request_id})
        return self.worker_ids.index(reply["worker_id"]), reply["overlap_blocks"]

    async def done(self, request_id: str) -> None:
        await self._ask({"op": "done", "request_id": request_id})

    async def scores(self, token_ids: list[int]) -> dict:
        """Dynamo's per-worker, per-tier overlap for `token_ids`."""
        return await self._ask({"op": "scores", "token_ids": token_ids})

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if process.stdout is not None:
                process.stdout.close()
        self.processes.clear()

    def __enter__(self) -> DynamoRouter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
