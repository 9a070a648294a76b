"""The tiered KV cache: one radix tree indexing KV pages on the device, on host and on disk.

The engine talks only to the facade, `tiered_cache.TieredCache`. Beneath it, imports point one
way, down: `residency` (which tier holds each node's pages; eviction, demotion, promotion) over
`transfer` (tickets, executors, copy jobs), over `index` (the tree, match/insert, locks), `pools`
(each tier's memory) and `disk` (the store). `tier` and `page_layout` are shared by all;
`metrics` holds the counters residency and the remote store record into.
"""
