"""The remote tier's store: KV pages in a Redis server or cluster shared by replicas.

`store` is the client (`RemoteStore`: one pipelined lookup of a prompt's next page keys, verified
fetches, batched deduplicated writes in a background thread, a bounded time budget per call, and
a degraded state with reconnection on any failure); `record` the self-describing, checksummed
value a page is stored as (pure); `keys` the Redis key names (a prefix and the page key's hex, so
no name reveals a token); `password` where the Redis password comes from (a file or the
environment, never the command line). The store's own eviction (`maxmemory`) bounds it.
"""
