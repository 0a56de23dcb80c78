"""The grammar compile worker: a child process that compiles JSON schemas with xgrammar.

Run as a script (`python -P grammar_worker.py`, by grammar_compiler.CompileWorker), so that it
imports xgrammar alone and none of the engine's package. It speaks length-prefixed frames
(multiprocessing.connection) on stdin and on a copy of stdout (fd 1 itself goes to stderr, so
nothing xgrammar prints can corrupt a frame):

  parent → child: the tokenizer info (TokenizerInfo.serialize_json), then one schema per frame
  child → parent: b"ready" once, then per schema b"ok" + CompiledGrammar.serialize_json()
                  or b"er" + why it could not compile

The parent kills the child when a compile runs past its deadline; the child exits by itself
when the parent closes its stdin (or dies).
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection


def main() -> None:
    requests = Connection(os.dup(0), writable=False)
    replies = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    import xgrammar as xgr

    info = xgr.TokenizerInfo.deserialize_json(requests.recv_bytes().decode())
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    replies.send_bytes(b"ready")
    while True:
        try:
            schema_text = requests.recv_bytes().decode("utf-8", "surrogatepass")
        except EOFError:
            return
        try:
            compiled = compiler.compile_json_schema(
                schema_text, any_whitespace=False, separators=(",", ":")
            )
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError variants
            replies.send_bytes(b"er" + str(exc).encode("utf-8", "replace"))
            continue
        replies.send_bytes(b"ok" + compiled.serialize_json().encode())


if __name__ == "__main__":
    main()
