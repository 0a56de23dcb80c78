"""What several benchmark modes share: the town-shaped workload (workload), one engine run over
it (engine_run, results) and its report (report), the baselines (baseline_transformers,
baseline_llamacpp), the compute floor (floor), the shared arguments (cli) and output (output)."""
