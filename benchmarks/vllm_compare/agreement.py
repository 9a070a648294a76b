"""Do the two servers generate the same thing? Greedy outputs token by token.

- Across servers (bf16 both): per prompt, the share of positions equal up to the first
  divergence. bf16 rounding differs between the two implementations, so a near-tie can flip
  and everything after it differs; the share says how far the outputs agree before that.
- Ours against transformers in fp32, on one short chat prompt: in fp32 a correct forward
  generates exactly what transformers does, so this is an equality check, not a share.

Tokens are compared as each token id's own decoding by the model's tokenizer: vLLM returns the
ids (`return_token_ids`), decoded here; tieredkv returns that decoding (`logprobs.tokens`).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import torch

from benchmarks.vllm_compare.client import Prompts
from tieredkv.bench.managed import ManagedServer
from tieredkv.model.default_model import default_model_dir
from tieredkv.model.tokenizer import ChatTokenizer

AGREEMENT_LENGTHS = (64, 512, 2048)  # prompt tokens
AGREEMENT_TOKENS = 64
PARITY_TOKENS = 32
PARITY_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def greedy_tokens(
    url: str, prompt: list[int], max_tokens: int, tokenizer: ChatTokenizer
) -> list[str]:
    """The server's greedy completion of `prompt`, one text per generated token: its token ids
    decoded one by one where it returns them (vLLM, `return_token_ids`), else its
    `logprobs.tokens` (tieredkv's, the same decoding)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    body.update(logprobs=1, return_token_ids=True)
    with httpx.Client(timeout=600) as http:
        body["model"] = http.get(url + "/v1/models").json()["data"][0]["id"]
        response = http.post(url + "/v1/completions", json=body)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    if choice.get("token_ids") is not None:
        tokens = [tokenizer.decode([i], skip_special_tokens=False) for i in choice["token_ids"]]
    else:
        tokens = choice["logprobs"]["tokens"]
    if len(tokens) != max_tokens:
        raise RuntimeError(f"{url}: {len(tokens)} tokens, asked for {max_tokens} (ignore_eos)")
    return tokens


def agreement_outputs(url: str, seed: int) -> list[list[str]]:
    """Each agreement prompt's greedy tokens (the same prompts for every server)."""
    prompts = Prompts(seed)
    tokenizer = prompts.tokenizer
    return [
        greedy_tokens(url, prompts.fresh(n), AGREEMENT_TOKENS, tokenizer) for n in AGREEMENT_LENGTHS
    ]


def first_divergence(a: list[str], b: list[str]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(ours: list[list[str]], theirs: list[list[str]]) -> list[dict]:
    """Per prompt: the first divergent position and the share of positions before it."""
    rows = []
    for length, mine, peer in zip(AGREEMENT_LENGTHS, ours, theirs, strict=True):
        at = first_divergence(mine, peer)
        equal = len(mine) if at is None else at
        rows.append(
            {
                "prompt_tokens": length,
                "generated_tokens": len(mine),
                "first_divergence": at,
                "agreement": equal / len(mine),
            }
        )
    return rows


def transformers_greedy(prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' own greedy tokens for `prompt` in fp32 (EOS not special: like ignore_eos)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        default_model_dir(), dtype=torch.float32
    ).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):  # the whole sequence each step: short, and no cache API
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def fp32_parity(log_dir: Path) -> dict:
    """Ours (`tieredkv serve --dtype float32`) against transformers on one short chat prompt:
    the token texts must be equal."""
    tokenizer = ChatTokenizer(default_model_dir())
    prompt = tokenizer.apply_chat_template(PARITY_MESSAGES, add_generation_prompt=True)
    expected = [
        tokenizer.decode([token], skip_special_tokens=False)
        for token in transformers_greedy(prompt, PARITY_TOKENS)
    ]
    args = ["--dtype", "float32", "--max-model-len", "1024", "--device-cache-size", "64MiB"]
    with ManagedServer(args, log_dir / "tieredkv-fp32.log") as server:
        ours = greedy_tokens(server.base_url, prompt, PARITY_TOKENS, tokenizer)
    at = first_divergence(ours, expected)
    result = {"prompt_tokens": len(prompt), "generated_tokens": PARITY_TOKENS}
    result.update({"equal": at is None, "first_divergence": at})
    print(f"  fp32 against transformers: {'equal' if at is None else f'diverged at {at}'}")
    return result
