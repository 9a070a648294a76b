"""The radix tree benchmark's parts: the chat workload, the driver that calls the cache as the
engine does, the timed phases, the machine's floors and the profile. Run it as
`.venv/bin/python benchmarks/radix_ops.py` (it imports this folder as the package `radix`)."""
