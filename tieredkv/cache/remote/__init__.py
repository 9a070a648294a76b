"""The remote tier's store: KV pages in a Redis server or cluster shared by replicas.

`remote_tier` is the tier (`RemoteTier`: the store seen as the lowest tier's pool of virtual
slots, its error counts and state); `lookup` names a prompt's pages past its local match and asks
the store how many it holds; `store` the store itself (`RemoteStore`: one pipelined lookup of a
prompt's next page keys, verified fetches, queued writes, a bounded time budget per call, a
degraded state on any failure); `writer` its background thread (batched, deduplicated writes;
reconnection with backoff); `client` the Redis client and its health (`RemoteClient`);
`connection` opening a single-server or cluster client and the budgets (`RemoteTimeouts`);
`get_replies` reads a fetch's GET replies off the socket into one reused buffer; `record` the
self-describing value a page is stored as, sealed with a MAC and holding no token (pure; the
codecs are `page_record`'s); `keys` the Redis key names (a prefix and the page's keyed name, so
no name reveals a token); `secret` the deployment secret and the keys derived from it (names,
MACs); `shared_generations` the flush generations replicas share through Redis; `password`
where the password comes from (a file or the environment, never the command line).
`memory_policy` reads Redis's `maxmemory-policy` at each connection and warns when it does not
suit the pages (what each policy evicts, retained pages included).
The store's counters live with the cache's (`cache.metrics`). Imports nothing from `disk`. The
store's own eviction (`maxmemory`) bounds it; tieredkv never deletes: a retained prompt's pages
carry an expiry instead (`writer`).
"""
