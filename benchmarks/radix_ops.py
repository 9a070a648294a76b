"""The radix tree's own cost on a multi-turn chat workload: `tieredkv bench radix`.

    .venv/bin/python benchmarks/radix_ops.py [--users 400] [--nodes 1000,10000,100000] [--json PATH]

The measurement lives in tieredkv/bench/radix.py (and radix_workload, radix_driver, radix_phases).
"""

import sys

from tieredkv.bench.radix import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
