"""The engine's core: a request's life from arrival to its last token.

`llm_engine` (the thread-safe front and the loop: schedule -> execute -> update_from_output),
`scheduler` (continuous batching, chunked prefill, preemption; what a step's tokens do to its
requests), `scheduler_output` (the step's plan, what the runner reads), `request`,
`sampling_params`, `metrics` (per-request metrics and the engine's stats), `detokenizer`,
`request_errors`. May import the engine's other folders (kv/, runner/, structured_output/,
loading/); nothing Django-side.
"""
