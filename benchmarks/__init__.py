"""Benchmark scripts, run as `.venv/bin/python benchmarks/NAME.py`; a package only so that
the tests can import their parts (`benchmarks.radix...`). Not installed with tieredkv."""
