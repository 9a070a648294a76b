"""What each tier holds for the served model, and the memory the process allocates for the
model and its tiers: logged once at start-up and served in `/health` as `capacity`.

A tier's tokens are its pages times the page size, for this model's layout and dtype (bytes per
token = 2 x layers x kv_heads x head_dim x dtype bytes). A device or host tier that keeps the
sliding layers of a model's pages only where a window reads them (device, host, disk) holds more
pages than its bytes hold whole ones: its tokens are those of whole pages, and `up_to_tokens`
those of pages without any sliding layer. The memory figure adds the loaded
weights, the tiers that live in this process's RAM (the device tier too on a CPU-only machine)
and the attention workspace; the Python runtime and its libraries come on top of it.
"""

from __future__ import annotations

from tieredkv.cache.disk.directory import STORE_FILE
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache

GIB = 1 << 30


def capacity_summary(
    cache: TieredCache, weights_bytes: int, workspace_bytes: int, device_in_ram: bool
) -> dict:
    """{"tiers": {label: {bytes, pages, tokens[, path, allocated_bytes]}}, "memory_bytes":
    {weights, device_tier, host_tier, workspace, total}}; the remote tier is shared and sized
    by its store (`maxmemory`), so it is named without figures. `device_in_ram`: the device
    tier lives in this process's RAM (a CPU-only machine)."""
    layout = cache.layout
    tiers: dict[str, dict] = {}
    for tier in Tier:
        if not cache.tier_enabled(tier):
            continue
        if tier is Tier.REMOTE:
            tiers[tier.label] = {"shared": True}
            continue
        pages, capacity = cache.tier_num_pages(tier), cache.tier_capacity_bytes(tier)
        whole_pages = min(pages, capacity // layout.page_bytes)
        tiers[tier.label] = {
            "bytes": capacity,
            "pages": pages,
            "tokens": whole_pages * layout.page_size,
        }
        most = cache.tier_max_pages(tier)
        if most > whole_pages:
            tiers[tier.label]["up_to_tokens"] = most * layout.page_size
    if cache.tier_enabled(Tier.DISK):
        path = cache.config.disk_cache_dir / STORE_FILE
        tiers[Tier.DISK.label] |= {
            "path": str(path),
            "allocated_bytes": path.stat().st_blocks * 512,
        }
    memory = {
        "weights": weights_bytes,
        "device_tier": tiers[Tier.DEVICE.label]["bytes"] if device_in_ram else 0,
        "host_tier": tiers.get(Tier.HOST.label, {}).get("bytes", 0),
        "workspace": workspace_bytes,
    }
    return {"tiers": tiers, "memory_bytes": {**memory, "total": sum(memory.values())}}


def capacity_lines(summary: dict, bytes_per_token: int) -> list[str]:
    """The summary for people: one line a tier, then the memory to expect."""
    lines = [f"KV: {bytes_per_token:,} B a token"]
    for label, tier in summary["tiers"].items():
        if tier.get("shared"):
            lines.append(f"  {label}: shared store, sized by its own maxmemory")
            continue
        line = f"  {label}: {tier['bytes'] / GIB:.2f} GiB, {tier['tokens']:,} tokens"
        if "up_to_tokens" in tier:
            line += f" (up to {tier['up_to_tokens']:,} without sliding-window layers)"
        if "path" in tier:
            line += f", {tier['path']} ({tier['allocated_bytes'] / GIB:.2f} GiB allocated)"
        lines.append(line)
    memory = summary["memory_bytes"]
    lines.append(
        f"memory for the model and tiers: {memory['total'] / GIB:.2f} GiB (weights "
        f"{memory['weights'] / GIB:.2f}, device tier in RAM {memory['device_tier'] / GIB:.2f}, "
        f"host tier {memory['host_tier'] / GIB:.2f}, attention workspace "
        f"{memory['workspace'] / GIB:.2f}), plus the Python runtime"
    )
    return lines
