"""Every benchmark of the engine, beside it: `python -m benchmarks <mode> ...` (see __main__).

One module per mode, each adding its own arguments (`add_cli_args`) and running them (`main`);
lib/ holds what several modes share: the town-shaped workload, the engine runs and their
report, the baselines, the compute floor, the arguments. benchmarks/ imports the engine
(inference.engine); nothing under inference/ imports benchmarks/.
"""
