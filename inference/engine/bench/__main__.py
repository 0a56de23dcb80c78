"""`python -m inference.engine.bench ...`: the old name of `python -m benchmarks <mode> ...`."""

import sys

from inference.engine.bench import run_benchmarks, translate

if __name__ == "__main__":
    run_benchmarks("inference.engine.bench", translate(sys.argv[1:]))
