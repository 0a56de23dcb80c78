"""The old name of `python -m benchmarks steady-decode`, for one release (see __init__)."""

import sys

from inference.engine.bench import run_benchmarks

if __name__ == "__main__":
    run_benchmarks("inference.engine.bench.steady_decode", ["steady-decode", *sys.argv[1:]])
