"""The radix tree's own cost on a multi-turn chat workload.

    .venv/bin/python benchmarks/radix_ops.py [--users 400] [--nodes 1000,10000,100000] [--json PATH]

The measurement lives in benchmarks/radix/ (radix.py, and radix_workload, radix_driver,
radix_phases, radix_limits, radix_profile).
"""

import sys

from radix.radix import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
