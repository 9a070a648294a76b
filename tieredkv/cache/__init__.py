"""The tiered KV cache: pools per tier, the radix tree, the mover and the facade."""
