#!/usr/bin/env python3
"""Bandwidth sweep in nccl-tests' format: ringcomm next to torch gloo (and MPI, nccl).

The same command as ``ringcomm-bench``; ``python benchmarks/sweep.py -h`` for flags.
The logic lives in ringcomm.bench (importable, tested); this file only calls it.
"""

import os
import sys

try:
    from ringcomm.bench.cli import main
except ImportError:
    # Not installed: use the source tree next to this script.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from ringcomm.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
