"""The pools: each tier's memory and its free list of page ids.

`PagePool` is what every tier's pool offers: page ids from a `PageFreeList`, sizes, and the
tier's one degraded flag. `DevicePool` (a layer-major tensor attention reads in place) and
`HostPool` (page-major, aligned or pinned) are pools, and so are the stores' tiers below them
(`disk.DiskStore`, `remote.RemoteTier`); `prefault` faults the host pool's memory in ahead of
use. Imports nothing above `tier` and `page_layout`: the mapping of every tier to its pool
(`TierPools`) sits beside the cache's facade, above the stores. Engine thread only.
"""
