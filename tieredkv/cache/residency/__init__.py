"""Residency: which tiers hold each node's pages, and the policies that move them.

`residence` is each node's record (copies per tier, transfers in flight, pins, heap stamps, the
counts that keep evictability O(1)); only this package reads it. `residency` is what the index
reports to, commits arrived copies parents first and drops copies; `node_transfers` starts
copies between tiers and applies each finished one (failures rolled back); `eviction` orders
evictable copies per tier (lazy LRU heaps) and `fair_share` among namespaces; `demotion` makes
room by moving copies one tier down and drops only at the last tier; `promotion` brings a
match's pages to the device and prefetches disk pages to host; `warm_restart` indexes the disk
records again at start; `integrity` reconciles all of it with the pools (tests, the debug
endpoint).
"""
