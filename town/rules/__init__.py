"""The town's rules, as pure functions over plain dataclasses: `world` (the town as the rules
see it), `clock`, `actions` (what a resident may do now), `effects` (what an action does),
`prompts` and `schema` (what a resident is asked and may answer), `diary`. No Django, no
inference: a test (tests/test_import_contracts.py) and an import-linter contract keep it so.
The Django side (town/models.py, town/services/) turns rows into these and back.
"""
