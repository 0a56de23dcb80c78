"""The old name of `python -m benchmarks weights-agreement`, for one release (see __init__)."""

import sys

from inference.engine.bench import run_benchmarks

if __name__ == "__main__":
    run_benchmarks("inference.engine.bench.weights_agreement", ["weights-agreement", *sys.argv[1:]])
