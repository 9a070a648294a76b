"""The remote tier's store: KV pages in a Redis server or cluster shared by replicas.

`remote_tier` is the store seen as the lowest tier's pool (`RemoteTier`: virtual slots, its
error counts and state); `lookup` names a prompt's pages past its local match and asks the store
how many it holds; `store` is the client (`RemoteStore`: one pipelined lookup of a prompt's next
page keys, verified fetches, queued writes, a bounded time budget per call, a degraded state on
any failure); `writer` its background thread (batched, deduplicated writes; reconnection with
backoff); `link` the client and its health; `connection` opening a single-server or cluster
client and the budgets (`RemoteTimeouts`); `record` the self-describing, checksummed value a
page is stored as (pure); `keys` the Redis key names (a prefix and the page key's hex, so no
name reveals a token); `password` where the password comes from (a file or the environment,
never the command line); `counters` the store's counters. The store's own eviction (`maxmemory`)
bounds it; tieredkv never deletes.
"""
