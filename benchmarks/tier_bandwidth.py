"""Tier transfer bandwidth beside this machine's own limits: `tieredkv bench tiers`.

    .venv/bin/python benchmarks/tier_bandwidth.py [--dir DIR] [--batches 64,256,1024] [--json PATH]

The measurement lives in tieredkv/bench/tiers.py (and tier_limits, tier_store, tier_copies).
"""

import sys

from tieredkv.bench.tiers import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
