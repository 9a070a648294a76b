"""The tiered KV cache: one radix tree indexing KV pages on the device, on host and on disk.

The engine talks only to the facade, `tiered_cache.TieredCache`, through one
`cache_handle.CacheHandle` per request; `build.build_cache` opens the stores and wires the parts
the facade delegates to. Beneath the facade, imports point one way, down: `residency` (which
tier holds each node's pages; eviction, demotion, promotion) over `transfer` (tickets,
executors, copy jobs), over `index` (the tree, match/insert, locks), `pools` (each tier's
memory), `disk` and `remote` (the stores). `tier` and `page_layout` are shared by all.
"""
