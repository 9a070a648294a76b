"""The pools: each tier's memory and its free list of page ids.

`DevicePool` (a layer-major tensor attention reads in place), `HostPool` (page-major, aligned or
pinned), both over `PageFreeList`; `TierPools` puts every tier's allocator, the disk store's
included, behind one interface with its health. Engine thread only.
"""
