"""The radix tree benchmarks' parts.

benchmarks/radix_ops.py (the tree's own cost; it imports this folder as the package `radix`):
the chat workload, the driver that calls the cache as the engine does, the timed phases, the
machine's floors and the profile. benchmarks/radix_vs_sglang.py (tieredkv's tree against
SGLang's RadixCache, run as `python -m benchmarks.radix_vs_sglang`): the replayed trace, one
replay per tree, and the records, figures and docs section of its result. Both time a
device-only cache whose executor (no_transfers) starts no thread and refuses every transfer.
"""
