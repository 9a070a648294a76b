"""`tieredkv serve --model DIR` on tiny Qwen3 and Gemma 3 directories (fp32): it starts, and a
greedy completion and its logprobs equal transformers' on the same directory, cold, with the
prompt cached, and on a second replica from the pages the first wrote to a real Redis; a
multimodal Gemma 3 directory is refused at start-up in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import transformers

from tests.integration.server_process import ServerProcess
from tests.redis_servers import RedisServer
from tests.unit.model.test_qwen3_gemma3_forward import hf_greedy, prompt_of, tiny_family_model
from tieredkv.cache.remote.keys import KEY_PREFIX
from tieredkv.cache.sliding_pages import REUSE_MARGIN_PAGES
from tieredkv.model.tokenizer import ChatTokenizer

SERVE = [sys.executable, "-c", "from tieredkv.cli import main; raise SystemExit(main())", "serve"]
SIZES = ["--max-model-len", "256", "--device-cache-size", "16MiB", "--host-cache-size", "16MiB"]
ARGS = ["--dtype", "float32", *SIZES]
TOLERANCE = 2e-4  # fp32 logprobs: ours against transformers'
NEW_TOKENS = 8
PAGE_SIZE = 16  # tieredkv serve's default


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Path]]:
    model_dir = tiny_family_model(tmp_path_factory.mktemp("model"), request.param)
    server = ServerProcess(["--model", str(model_dir), *ARGS], model_dir.parent / "serve.log")
    yield server, model_dir
    server.stop()


class Expected:
    """transformers' greedy continuation of `ids` on `model_dir`: its text and logprobs."""

    def __init__(self, model_dir: Path, ids: list[int]) -> None:
        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        tokens = hf_greedy(hf.eval(), ids, NEW_TOKENS)
        with torch.no_grad():
            logits = hf(torch.tensor([ids + tokens])).logits[0].float()
        rows = torch.log_softmax(logits, dim=-1)[len(ids) - 1 : len(ids) - 1 + NEW_TOKENS]
        self.text = ChatTokenizer(model_dir).decode(tokens)
        self.logprobs = rows.max(dim=-1).values.tolist()

    def check(self, server: ServerProcess, ids: list[int]) -> dict:
        """The server's greedy completion of `ids` equals this; returns its usage."""
        body = {"prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0, "logprobs": 1}
        response = httpx.post(
            server.base_url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=120
        )
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["text"] == self.text
        values = choice["logprobs"]["token_logprobs"]
        assert values == pytest.approx(self.logprobs, abs=TOLERANCE)
        return response.json()["usage"]["prompt_tokens_details"]


def test_greedy_completion_and_logprobs_equal_transformers(served) -> None:
    server, model_dir = served
    ids = prompt_of(30, seed=12)
    expected = Expected(model_dir, ids)
    assert expected.check(server, ids)["cached_tokens"] == 0
    assert expected.check(server, ids)["cached_tokens_by_tier"]["device"] > 0


@pytest.mark.parametrize("whole", [False, True], ids=["split-by-default", "whole-pages"])
def test_every_local_tier_splits_gemma3_pages_unless_asked_and_reports_each_kind(
    tmp_path: Path, whole: bool
) -> None:
    """By default the device, host and disk tiers store a Gemma 3 page a layer at a time (more
    pages in the same bytes as fewer keep their sliding layers), reported per layer kind in
    /health; `--host-whole-pages`, `--device-whole-pages` and `--disk-whole-pages` keep whole
    pages; completions equal transformers' either way."""
    model_dir = tiny_family_model(tmp_path, "gemma3")
    flags = ["--host-whole-pages", "--device-whole-pages", "--disk-whole-pages"] if whole else []
    disk = ["--disk-cache-dir", str(tmp_path / "disk"), "--disk-cache-size", "16MiB"]
    server = ServerProcess(["--model", str(model_dir), *ARGS, *disk, *flags], tmp_path / "host.log")
    try:
        ids = prompt_of(60, seed=15)
        expected = Expected(model_dir, ids)
        assert expected.check(server, ids)["cached_tokens"] == 0
        assert expected.check(server, ids)["cached_tokens_by_tier"]["device"] > 0
        health = httpx.get(server.base_url + "/health", timeout=30).json()
        host, kinds = health["capacity"]["tiers"]["host"], health["layer_kinds"]
        token_bytes = kinds["full"]["token_bytes"] + kinds["sliding"]["token_bytes"]
        whole_pages = host["bytes"] // (PAGE_SIZE * token_bytes)
        assert host["tokens"] == whole_pages * PAGE_SIZE
        if whole:
            assert host["pages"] == whole_pages and "up_to_tokens" not in host
        else:  # pages without their sliding part need only their full layers' bytes
            assert host["pages"] > whole_pages
            assert host["up_to_tokens"] == host["pages"] * PAGE_SIZE
        assert kinds["sliding"]["tokens_by_tier"]["host"] <= kinds["full"]["tokens_by_tier"]["host"]
        device = health["capacity"]["tiers"]["device"]
        device_whole_pages = device["bytes"] // (PAGE_SIZE * token_bytes)
        assert device["tokens"] == device_whole_pages * PAGE_SIZE
        if whole:
            assert "up_to_tokens" not in device
        else:  # pages are allocated whole; those that lost their sliding part take less
            assert device["up_to_tokens"] > device["tokens"]
        disk_tier = health["capacity"]["tiers"]["disk"]
        if whole:  # a whole-page record a page
            assert "up_to_tokens" not in disk_tier and disk_tier["tokens"] > 0
        else:  # a record a layer: pages without their sliding layers take fewer
            assert disk_tier["up_to_tokens"] > disk_tier["tokens"] > 0
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("family", "window", "prompt_tokens"),
    [("qwen3", None, 100), ("gemma3", 128, 100), ("gemma3", 32, 200)],
    ids=["qwen3", "gemma3-within-the-window", "gemma3-six-windows"],
)
def test_a_second_replica_answers_from_redis_as_transformers(
    redis: RedisServer, tmp_path: Path, family: str, window: int | None, prompt_tokens: int
) -> None:
    """The first replica writes each page's full part, and the sliding part only of the pages
    within the window (and margin) before the path's end, though its prefill inserted a node
    every 48 tokens; the second reuses every whole page."""
    overrides = {"sliding_window": window} if window else {}
    model_dir = tiny_family_model(tmp_path, family, **overrides)
    ids = prompt_of(prompt_tokens, seed=13)
    expected = Expected(model_dir, ids)
    args = ["--model", str(model_dir), *ARGS, *redis.serve_flags()]
    args += ["--debug-endpoints", "--remote-budget-scale", "20", "--max-batch-tokens", "48"]
    first = ServerProcess(args, tmp_path / "first.log")
    second = ServerProcess(args, tmp_path / "second.log")
    pages = (len(ids) + NEW_TOKENS - 1) // PAGE_SIZE  # the KV computed: the last token's is not
    kept = 0
    if window is not None:  # the path's end is its one reuse point
        span = window - 1 + REUSE_MARGIN_PAGES * PAGE_SIZE
        kept = pages - max(0, pages * PAGE_SIZE - span) // PAGE_SIZE
    try:
        expected.check(first, ids)
        wait_for_remote_writes(first, pages + kept)
        assert len(redis.client().keys(KEY_PREFIX + "*")) == pages + kept
        by_tier = expected.check(second, ids)["cached_tokens_by_tier"]
        assert by_tier["remote"] == len(ids) // PAGE_SIZE * PAGE_SIZE  # every whole page
    finally:
        first.stop()
        second.stop()
    if window == 32:
        assert kept < pages / 2  # most pages' sliding layers never reached Redis


def test_pages_from_redis_without_their_sliding_layers_survive_a_disk_restart(
    redis: RedisServer, tmp_path: Path
) -> None:
    """A replica (its host pool split, the default) promotes a Gemma 3 history from Redis (most
    pages without their sliding layers) and writes it through to its disk; restarted on that
    disk alone, it reuses the history as far as the kept windows allow and answers as
    transformers."""
    model_dir = tiny_family_model(tmp_path, "gemma3", sliding_window=32)
    ids = prompt_of(200, seed=13)
    expected = Expected(model_dir, ids)
    common = ["--model", str(model_dir), *ARGS, "--max-batch-tokens", "48"]
    disk = ["--disk-cache-dir", str(tmp_path / "disk"), "--disk-cache-size", "64MiB"]
    remote = [*redis.serve_flags(), "--debug-endpoints", "--remote-budget-scale", "20"]
    first = ServerProcess([*common, *remote], tmp_path / "first.log")
    try:
        expected.check(first, ids)
        wait_for_remote_writes(first, 12 + 4)  # 12 pages, the last 4 with sliding layers
    finally:
        first.stop()
    second = ServerProcess([*common, *remote, *disk], tmp_path / "second.log")
    try:
        assert expected.check(second, ids)["cached_tokens_by_tier"]["remote"] == 192
        # pinned: kept on host, and so written through to disk, with the gaps Redis gave
        pinned = httpx.post(second.base_url + "/v1/cache/pin", json={"prompt": ids}, timeout=60)
        assert pinned.status_code == 200, pinned.text
        kinds = httpx.get(second.base_url + "/health", timeout=30).json()["layer_kinds"]
        held = {kind: kinds[kind]["tokens_by_tier"]["host"] for kind in ("full", "sliding")}
        assert held["full"] >= 192 > held["sliding"]  # the split host kept no more than Redis
    finally:
        second.stop()  # lets the write-through to disk finish
    third = ServerProcess([*common, *disk], tmp_path / "third.log")
    try:
        # from disk (the pin, kept in the disk directory, brought it up again at start)
        assert expected.check(third, ids)["cached_tokens"] == 192  # its end kept its window
        # a prompt diverging at 150 could reuse 144 tokens, but that window's pages came
        # without their sliding layers: it reuses none and still answers as transformers
        shorter = [*ids[:150], 5]
        assert Expected(model_dir, shorter).check(third, shorter)["cached_tokens"] == 0
    finally:
        third.stop()


def wait_for_remote_writes(server: ServerProcess, pages: int, timeout_s: float = 60.0) -> None:
    """Until `server` has written `pages` values to Redis (its writes are asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        debug = httpx.get(server.base_url + "/debug/cache", timeout=30).json()
        if debug["remote_store"]["writes"] >= pages:
            return
        time.sleep(0.2)  # test code: waiting for another process's background writes
    raise AssertionError(f"fewer than {pages} remote values after {timeout_s} s: {debug}")


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_bf16_serves_close_to_transformers(tmp_path: Path, family: str) -> None:
    """`--dtype bfloat16` (the CPU's fused and C elementwise kernels): the greedy tokens'
    logprobs stay within bf16 rounding of transformers' fp32 ones."""
    model_dir = tiny_family_model(tmp_path, family)
    ids = prompt_of(30, seed=14)
    expected = Expected(model_dir, ids)
    args = ["--model", str(model_dir), "--dtype", "bfloat16", *SIZES]
    server = ServerProcess(args, tmp_path / "bf16.log")
    try:
        body = {"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 1}
        response = httpx.post(server.base_url + "/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        value = response.json()["choices"][0]["logprobs"]["token_logprobs"][0]
        assert value == pytest.approx(expected.logprobs[0], abs=0.1)
    finally:
        server.stop()


def test_a_multimodal_gemma3_directory_is_one_line_at_start_up(tmp_path: Path) -> None:
    text_dir = tiny_family_model(tmp_path, "gemma3")
    config = json.loads((text_dir / "config.json").read_text())
    multimodal = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": config,
        "vision_config": {"model_type": "siglip_vision_model"},
    }
    (text_dir / "config.json").write_text(json.dumps(multimodal))
    done = subprocess.run(
        [*SERVE, "--model", str(text_dir), *ARGS, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("tieredkv serve: error:") and "model_type='gemma3'" in lines[0]
