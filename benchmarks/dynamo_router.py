"""NVIDIA Dynamo's KV-aware router (PyPI `ai-dynamo-runtime`) over tieredkv replicas that publish
KV events, run in the router's own virtual environment (benchmarks/dynamo_router.sh makes it):

    .venv-router/bin/python benchmarks/dynamo_router.py worker --kv-events tcp://H:P \
        --page-size N
    .venv-router/bin/python benchmarks/dynamo_router.py router --port P --page-size N

Dynamo runs without etcd or NATS: discovery through files (`DYN_FILE_KV`, one directory the
workers and the router share), requests over TCP and events over ZMQ. A `worker` is the Dynamo
side of one replica: it registers an endpoint instance (the router's candidate) and relays the
replica's ZMQ KV events into Dynamo's event plane with Dynamo's own `KvEventPublisher`, the
relay vLLM's Dynamo integration uses. It prints one JSON line, `{"worker_id": ...}`, once
registered. The `router` holds Dynamo's `KvRouter` (its indexer fed by those events, its cost
function weighing overlap against each worker's active prefill and decode load) and answers
newline-delimited JSON over TCP, one request per connection:

    {"op": "route", "token_ids": [...], "request_id": "r1"} -> {"worker_id": W, "overlap_blocks": K}
    {"op": "done", "request_id": "r1"}                        -> {}   (the request finished)
    {"op": "scores", "token_ids": [...]}                      -> the per-worker, per-tier overlap

This file imports nothing from tieredkv: it runs under the router's Python.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

NAMESPACE_PATH = "tieredkv.backend.generate"  # namespace.component.endpoint the workers serve
MODEL_NAME = "tieredkv"  # the model card the workers register (no assets)


def _runtime():  # the Dynamo runtime without etcd or NATS
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    return DistributedRuntime(loop, "file", "tcp", event_plane="zmq")


async def _never_called(request, context=None):
    """The endpoint the router counts as a worker; the benchmark sends requests to the replica's
    own HTTP server, so nothing is ever generated here."""
    yield {"token_ids": [], "finish_reason": "error"}


async def run_worker(kv_events: str, page_size: int, topic: str) -> None:
    from dynamo.llm import KvEventPublisher, ModelInput, ModelType, WorkerType, register_model

    runtime = _runtime()
    endpoint = runtime.endpoint(NAMESPACE_PATH)
    serving = asyncio.ensure_future(endpoint.serve_endpoint(_never_called))
    # the router counts a worker once its model card is registered; nothing is loaded for it
    await register_model(
        ModelInput.Tokens, ModelType.Completions, endpoint, MODEL_NAME,
        worker_type=WorkerType.Aggregated, kv_cache_block_size=page_size,
        skip_model_assets=True,
    )  # fmt: skip
    publisher = KvEventPublisher(
        endpoint, kv_block_size=page_size, zmq_endpoint=kv_events, zmq_topic=topic
    )
    print(json.dumps({"worker_id": endpoint.connection_id()}), flush=True)
    await serving
    del publisher


async def run_router(port: int, page_size: int) -> None:
    from dynamo.llm import KvRouter, KvRouterConfig

    runtime = _runtime()
    endpoint = runtime.endpoint(NAMESPACE_PATH)
    router = KvRouter(endpoint, page_size, KvRouterConfig())

    async def answer(request: dict) -> dict:
        op = request["op"]
        if op == "route":
            worker_id, _, overlap = await router.best_worker(
                request["token_ids"], request_id=request["request_id"]
            )
            return {"worker_id": worker_id, "overlap_blocks": overlap}
        if op == "done":
            await router.free(request["request_id"])
            return {}
        if op == "scores":
            return await router.get_overlap_scores(request["token_ids"])
        return {"error": f"unknown op {op!r}"}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            reply = await answer(json.loads(line))
        except Exception as error:  # one bad request answers an error, the router goes on
            reply = {"error": f"{type(error).__name__}: {error}"}
        writer.write(json.dumps(reply).encode() + b"\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    print(json.dumps({"port": port}), flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    roles = parser.add_subparsers(dest="role", required=True)
    worker = roles.add_parser("worker", help="relay one replica's KV events")
    worker.add_argument("--kv-events", required=True, help="the replica's ZMQ PUB endpoint")
    worker.add_argument("--topic", default="", help="the replica's KV events topic")
    router = roles.add_parser("router", help="Dynamo's KvRouter, answering JSON lines")
    router.add_argument("--port", type=int, required=True)
    for role in (worker, router):
        role.add_argument("--page-size", type=int, required=True, help="tokens per page")
    args = parser.parse_args(argv)
    if args.role == "worker":
        asyncio.run(run_worker(args.kv_events, args.page_size, args.topic))
    else:
        asyncio.run(run_router(args.port, args.page_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
