"""The old name of `python -m benchmarks load-checkpoint`, for one release (see __init__)."""

import sys

from inference.engine.bench import run_benchmarks

if __name__ == "__main__":
    run_benchmarks("inference.engine.bench.load_checkpoint", ["load-checkpoint", *sys.argv[1:]])
