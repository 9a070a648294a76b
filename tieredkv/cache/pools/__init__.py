"""The pools: each tier's memory and its free list of page ids.

`PagePool` is what every tier's pool offers: page ids from a `PageFreeList`, sizes, and the
tier's one degraded flag. `DevicePool` (a layer-major tensor attention reads in place) and
`HostPool` (page-major, aligned or pinned) are pools, and so is the disk store's `DiskStore`.
`TierPools` maps each enabled tier to its pool: allocation, sizes, health and the next tier
down, one line each. Engine thread only.
"""
