"""JSON-schema constrained decoding: `structured_output` (a compiler per engine, a matcher per
request, the step's token masks), `grammar_compiler` (compile once per schema, off the engine's
lock, with a deadline; optional killable worker processes running `grammar_worker`),
`schema_limits` (what a schema may ask before anything compiles). Imports xgrammar.
"""
