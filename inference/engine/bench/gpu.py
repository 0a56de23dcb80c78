"""The old name of `python -m benchmarks gpu`, for one release (see __init__)."""

import sys

from inference.engine.bench import run_benchmarks

if __name__ == "__main__":
    run_benchmarks("inference.engine.bench.gpu", ["gpu", *sys.argv[1:]])
