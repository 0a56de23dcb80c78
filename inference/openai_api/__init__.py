"""An OpenAI-compatible API over our engine: /v1/chat/completions (with JSON-schema response
formats, streaming and cached-token usage) and /v1/models, executed on the inference nodes."""
