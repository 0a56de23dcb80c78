"""Completions: one chat completion, from a CompletionRequest to a Completion (types.py), on this
process's engine (runtime.py) or an external OpenAI-compatible server (remote.py), with what
serves it: streaming to the web (streams.py), schema compiles (schema_compiles.py), cache salts
(cache_salt.py), token counts (tokens.py) and the Prometheus metrics (metrics.py,
engine_stats.py). The town reaches it through inference/services.py."""
