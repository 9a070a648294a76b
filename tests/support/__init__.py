"""Test support shared by tests of several packages.

- `tiny_cache`: a tiny page layout, a tiered cache on manual executors, and page contents
  derived from page keys, so a test can check that a page holds the bytes inserted for that
  exact prefix and namespace.
- `manual_executor`: `ManualTransferExecutor`, whose copy jobs run only when the test completes
  their tickets, in any order, or fail without running.
- `fault_io`: `FaultInjectingIO`, a disk I/O backend that fails, tears or "crashes" chosen
  writes and reads, and `SimulatedCrash`.
- `greedy`: `generate_greedy`, one sequence generated greedily on a `ModelRunner` without the
  cache.
"""
