"""The tiered KV cache: one radix tree indexing KV pages on the device, on host, on disk and in
a remote store.

The engine talks only to the facade, `tiered_cache.TieredCache`, through one
`cache_handle.CacheHandle` per request; `build.build_cache` opens the stores and wires the parts
the facade delegates to. Beneath the facade, imports point one way, down, type-only imports
included: `residency` (which tier holds each node's pages; eviction, demotion, promotion) over
`transfer` (tickets, executors, copy jobs), over the two stores, `disk` and `remote` (peers:
neither imports the other), over `index` (the tree, match/insert, locks) and `pools` (the
device and host tiers' memory). `tier_pools` maps each enabled tier to its pool, stores
included, for residency and the facade. `tier` and `page_layout` are shared by all; `metrics`
holds the counters residency and the remote store record into; `flush_generations` the
generations a flush advances, which namespace root keys mix in (`remote` shares them).
"""
