"""Transfers: moving page bytes between tiers off the engine thread.

`mover` holds every transfer as a `TransferTicket` (one `TransferPart` per node) and queues the
outcomes for the engine thread; `executor` runs copy jobs on worker threads or CUDA streams;
`page_copier` builds the job for a pair of tiers, over `page_rows` (strided page copies between
layouts) and `page_staging` (reused per-thread staging buffers).
"""
