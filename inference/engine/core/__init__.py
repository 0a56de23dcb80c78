"""The engine's top floor: a request's life from arrival to its last token.

`llm_engine` (the thread-safe front and the loop: schedule -> execute -> update_from_output),
`engine_builder` (an EngineConfig becomes the model, the KV cache manager, the scheduler, the
runner, ...), `input_processor` (a prompt becomes a checked Request), `scheduler` (continuous
batching, chunked prefill, preemption; what a step's tokens do to its requests),
`output_processor` (a request's output or stream to its caller), `detokenizer`, `engine_stats`
(the EngineStats snapshot from the components' own). The data types it shares with the
floors below live at the engine's root (`request`, `sampling_params`, `scheduler_output`,
`metrics`, `request_errors`, `outputs`). Imports the engine's other folders (kv/, runner/,
structured_output/, loading/); none of them imports this one (tests/test_import_contracts.py),
and nothing Django-side.
"""
