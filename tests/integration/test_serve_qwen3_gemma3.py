"""`tieredkv serve --model DIR` on tiny Qwen3 and Gemma 3 directories (fp32): it starts, and a
greedy completion and its logprobs equal transformers' on the same directory, cold and with the
prompt cached; a multimodal Gemma 3 directory is refused at start-up in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import transformers

from tests.integration.server_process import ServerProcess
from tests.unit.model.test_qwen3_gemma3_forward import hf_greedy, prompt_of, tiny_family_model
from tieredkv.model.tokenizer import ChatTokenizer

SERVE = [sys.executable, "-c", "from tieredkv.cli import main; raise SystemExit(main())", "serve"]
ARGS = ["--dtype", "float32", "--max-model-len", "256", "--device-cache-size", "16MiB"]
ARGS += ["--host-cache-size", "16MiB"]
TOLERANCE = 2e-4  # fp32 logprobs: ours against transformers'


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Path]]:
    model_dir = tiny_family_model(tmp_path_factory.mktemp("model"), request.param)
    server = ServerProcess(["--model", str(model_dir), *ARGS], model_dir.parent / "serve.log")
    yield server, model_dir
    server.stop()


def test_greedy_completion_and_logprobs_equal_transformers(served) -> None:
    server, model_dir = served
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = prompt_of(30, seed=12)
    expected = hf_greedy(hf, ids, 8)
    with torch.no_grad():
        rows = torch.log_softmax(hf(torch.tensor([ids + expected])).logits[0].float(), dim=-1)
    text = ChatTokenizer(model_dir).decode(expected)
    body = {"prompt": ids, "max_tokens": 8, "temperature": 0, "logprobs": 1, "ignore_eos": True}
    for attempt in ("cold", "cached"):
        response = httpx.post(server.base_url + "/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["text"] == text, attempt
        values = choice["logprobs"]["token_logprobs"]
        assert values == pytest.approx(
            [float(rows[len(ids) - 1 + step].max()) for step in range(8)], abs=TOLERANCE
        )
    usage = response.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0


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
