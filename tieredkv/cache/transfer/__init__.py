"""Transfers: moving page bytes between tiers off the engine thread.

`transfer_queue` holds every transfer as a `TransferTicket` (one `TransferPart` per node)
and queues the outcomes for the engine thread; `executors` run transfer jobs on worker threads
or CUDA streams; `transfer_jobs` builds the job for a pair of tiers, over `layout_copy` (strided
page copies between layouts) and `page_staging` (reused per-thread staging buffers).
"""
