"""Every benchmark, beside the product: `python -m benchmarks <mode> ...` (see __main__).

One module per mode, each adding its own arguments (`add_cli_args`) and running them (`main`);
lib/ holds what several modes share: the town-shaped workload, the engine runs and their
report, the baselines, the compute floor, the arguments, the node workers of node-policies.
benchmarks/ imports the engine (inference.engine), and node-policies the town through Django;
nothing of the product (inference/, town/, pokosite/) imports benchmarks/.
"""
