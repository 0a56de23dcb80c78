"""The town-shaped benchmark (`python -m inference.engine.bench`): workload, runs, report."""
