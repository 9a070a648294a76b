"""Two real `tieredkv serve` replicas publishing KV events on real ZMQ sockets, behind NVIDIA
Dynamo's real KV router (benchmarks/dynamo_router.py, in the venv benchmarks/dynamo_router.sh
makes): a prompt one replica served shows up in the router's index as that replica's pages,
the router sends the same prompt there, and once that replica's cache is flushed the router
no longer counts them; pages pushed from a replica's device tier to its host tier move there in
the router's index too, and the router still sends the prompt to that replica."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator

import httpx
import pytest

from benchmarks import dynamo_process
from tests.integration.server_process import ServerProcess, free_port
from tests.integration.test_server_e2e import MODEL, document
from tieredkv.model.default_model import default_model_dir
from tieredkv.model.tokenizer import ChatTokenizer

PAGE_SIZE = 16  # the replicas' default
REPLICA_ARGS = ["--dtype", "float32", "--max-model-len", "1024", "--device-cache-size", "64MiB",
                "--host-cache-size", "128MiB"]  # fmt: skip
FLOOD_PROMPTS = 7  # of 18 pages each: more than the device tier's 91 fp32 pages
EVENTS_S = 20.0  # how long the router may take to learn what a replica did


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[ServerProcess, str]]]:
    try:
        dynamo_process.require_dynamo()
    except dynamo_process.DynamoMissingError as exc:
        pytest.skip(str(exc))
    logs = tmp_path_factory.mktemp("replicas")
    ports = [free_port() for _ in range(2)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(
                ServerProcess,
                [*REPLICA_ARGS, "--kv-events-endpoint", f"tcp://*:{port}"],  # binds
                logs / f"replica{i}.log",
            )
            for i, port in enumerate(ports)
        ]
        servers = [future.result() for future in futures]
    yield [(s, f"tcp://127.0.0.1:{p}") for s, p in zip(servers, ports, strict=True)]
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def router(replicas: list, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    endpoints = [endpoint for _, endpoint in replicas]
    with dynamo_process.DynamoRouter(endpoints, PAGE_SIZE, tmp_path_factory.mktemp("dynamo")) as r:
        yield r


def indexed_pages(
    router: dynamo_process.DynamoRouter, token_ids: list[int], tier: str
) -> list[int]:
    """Per replica, the prompt's leading pages the router indexes on that replica, counted
    through `tier` (Dynamo's `device_blocks`, `host_pinned_blocks`, `disk_blocks`)."""
    scores = asyncio.run(router.scores(token_ids))
    by_worker = {row["worker_id"]: row[tier] for row in scores["workers"]}
    return [by_worker.get(worker_id, 0) for worker_id in router.worker_ids]


def wait_for_pages(router, token_ids: list[int], wanted: list[int], tier="device_blocks"):
    deadline = time.monotonic() + EVENTS_S
    seen = indexed_pages(router, token_ids, tier)
    while seen != wanted and time.monotonic() < deadline:
        time.sleep(0.1)  # test code: events travel through two other processes
        seen = indexed_pages(router, token_ids, tier)
    return seen


def complete(server: ServerProcess, token_ids: list[int]) -> None:
    body = {"model": MODEL, "prompt": token_ids, "max_tokens": 2, "temperature": 0}
    response = httpx.post(server.base_url + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text


def test_router_follows_the_replicas_pages(replicas: list, router) -> None:
    token_ids = ChatTokenizer(default_model_dir()).encode(document(5, 300))
    num_pages = len(token_ids) // PAGE_SIZE
    assert num_pages >= 10, f"the prompt has {len(token_ids)} tokens: too short to tell"
    assert wait_for_pages(router, token_ids, [0, 0]) == [0, 0]

    holder = replicas[1][0]
    complete(holder, token_ids)
    assert wait_for_pages(router, token_ids, [0, num_pages]) == [0, num_pages]

    replica, overlap = asyncio.run(router.route(token_ids, "test-request"))
    asyncio.run(router.done("test-request"))
    assert (replica, overlap) == (1, num_pages)

    flushed = httpx.post(holder.base_url + "/v1/cache/flush", timeout=30)
    assert flushed.status_code == 200, flushed.text
    assert wait_for_pages(router, token_ids, [0, 0]) == [0, 0]


def test_router_sees_pages_demoted_to_host_and_still_routes_there(replicas: list, router) -> None:
    tokenizer = ChatTokenizer(default_model_dir())
    token_ids = tokenizer.encode(document(7, 300))
    num_pages = len(token_ids) // PAGE_SIZE
    holder = replicas[0][0]
    complete(holder, token_ids)
    assert wait_for_pages(router, token_ids, [num_pages, 0]) == [num_pages, 0]

    # other prompts, more pages than the device tier holds, push the first one's to host
    for seed in range(20, 20 + FLOOD_PROMPTS):
        complete(holder, tokenizer.encode(document(seed, 300)))
    assert wait_for_pages(router, token_ids, [0, 0]) == [0, 0]
    host = wait_for_pages(router, token_ids, [num_pages, 0], "host_pinned_blocks")
    assert host == [num_pages, 0]

    replica, _ = asyncio.run(router.route(token_ids, "demoted-request"))
    asyncio.run(router.done("demoted-request"))
    assert replica == 0
