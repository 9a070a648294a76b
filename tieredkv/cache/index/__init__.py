"""The index: which token prefixes are cached, as one radix tree of page runs per namespace.

`radix_node` and `radix_tree` keep the tree's shape (split, merge, attach, remove, lock counts on
a path); `token_run` packs token ids into the bytes the tree compares; `page_key` chains the
BLAKE2b key that names each page outside the process (disk records, restarts), computed when a
page first needs one; `radix_index` matches and inserts prompts, owns the access clock, the
locks and the device pages lent to requests; `match_results` is what it hands back. The index
never decides where copies live: it reports every node it changed to `TreeEvents` (the
residency layer). Imports nothing above it.
"""
