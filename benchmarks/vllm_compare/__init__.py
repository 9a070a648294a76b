"""tieredkv against vLLM's CPU build: the parts of `benchmarks/vs_vllm.py`.

- `client`: seeded token-id prompts and one streamed completion, its tokens counted from
  `usage` (a stream whose chunks cannot account for them is refused)
- `figures`: cold prefill, warm turns, decode, for one server
- `peers`: vLLM's process (as its CPU docs recommend), its versions and settings, and the peak
  memory of a server's process tree
- `agreement`: the two servers' greedy outputs against each other, ours against transformers
- `tiers`: tieredkv alone, a history on disk against the same history on the device
- `overflow`: many chats over the KV budget, vLLM at our RAM and at the working set's
- `report`: the raw result's tables (`render_markdown`), several runs of one sitting combined
"""
