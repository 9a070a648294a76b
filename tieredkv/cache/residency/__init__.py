"""Residency: which tiers hold each node's pages, and the policies that move them.

`residency` starts transfers and applies their outcomes (parents before children, failures
rolled back); `eviction` orders evictable copies per tier (lazy LRU heaps); `demotion` makes
room by moving copies one tier down and drops only at the last tier; `promotion` brings a
match's pages to the device and prefetches disk pages to host.
"""
