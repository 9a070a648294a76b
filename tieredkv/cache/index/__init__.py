"""The index: which token prefixes are cached, as one radix tree of page runs per namespace.

`radix_node` and `radix_tree` keep the tree's shape (split, merge, attach, remove, lock counts on
a path); `token_run` packs token ids into the bytes the tree compares; `page_key` chains the
BLAKE2b key that names each page outside the process (disk records, restarts), computed when a
page first needs one; `radix_index` matches and inserts prompts, owns the access clock, the
locks and the device pages lent to requests; `match_results` is what it hands back, and the
opaque `PathEnd` callers hold a node as. The index never reads or writes copies: each node
carries one record of the residency layer, which the tree only asks through `NodeState` (make a
child's, split, merge, empty, the serving copy), and `insert` hands pages to `TreeEvents`.
Imports nothing above it.
"""
