"""JSON-schema constrained decoding with xgrammar: a compiler per engine, a matcher per request.

Each step, every constrained request fills its row of a token bitmask, the bitmask is applied
to the logits (disallowed tokens → -inf), and the sampled token is fed back to the matcher.
After it, the tokens the grammar forces (keys, punctuation, the rest of an enum value once its
start is chosen) can be appended at once (jump-forward): they need no model step of their own,
only their K/V, computed with the next step's token.

A schema is checked against SchemaLimits (schema_limits) and compiled once, by GrammarCache
(grammar_compiler; what it compiled serves every engine of the same tokenizer in this process),
outside any engine-wide lock: in a thread of this process whose caller waits at most the
compile deadline, or (max_compile_workers > 0) in worker processes killed past it.
`compile_async` starts a compile on the manager's own compile threads (as many as workers) and
hands back a future, so a caller that serves other requests never waits on one (vLLM's
structured-output manager compiles on its executor the same way).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import xgrammar as xgr

from inference.engine.config import StructuredOutputConfig
from inference.engine.loading.tokenizer import Tokenizer
from inference.engine.request_errors import EngineShutDown, RequestError
from inference.engine.structured_output.grammar_compiler import (
    CompiledGrammars,
    GrammarCache,
    compile_in_thread,
    shared_grammars,
    shared_pools,
)
from inference.engine.structured_output.schema_limits import check_schema

_VOCAB_TYPES = {
    "byte_level": xgr.VocabType.BYTE_LEVEL,
    "byte_fallback": xgr.VocabType.BYTE_FALLBACK,  # SentencePiece: "▁" spaces, <0xNN> bytes
    "raw": xgr.VocabType.RAW,
}


@dataclass(frozen=True, slots=True)
class CompileOutcome:
    """What `compile_async` found: the seconds its own compile ran (0.0: the schema was compiled
    before, or another caller's compile of it was joined) and why the schema was refused (None:
    it compiled)."""

    compile_s: float
    error: str | None


class GrammarState:
    """One request's position in its grammar."""

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self.matcher = xgr.GrammarMatcher(compiled)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, after: Sequence[int] = ()) -> None:
        """Fill `row` with the tokens allowed next; `after`: as if these (a draft's first
        tokens, already checked by cut_draft) were accepted first (the matcher is rolled back)."""
        for token_id in after:
            accepted = self.matcher.accept_token(token_id)
            assert accepted, f"draft token {token_id} was refused by the grammar"
        try:
            self.matcher.fill_next_token_bitmask(bitmask, row)
        finally:
            if after:
                self.matcher.rollback(len(after))

    def cut_draft(self, draft: Sequence[int], *, stop_at_forced: bool) -> list[int]:
        """The draft's longest prefix the grammar accepts, ending at the first token that
        completes the grammar or (`stop_at_forced`: jump-forward is on) after which the grammar
        forces tokens: those are appended by jump-forward, not verified (see spec_decode).
        The matcher is left as it was."""
        kept: list[int] = []
        try:
            for token_id in draft:
                if not self.matcher.accept_token(token_id):
                    break
                kept.append(token_id)
                if self.matcher.is_terminated():
                    break
                if stop_at_forced and self.matcher.find_jump_forward_tokens():
                    break
        finally:
            if kept:
                self.matcher.rollback(len(kept))
        return kept

    def accept(self, token_id: int) -> None:
        accepted = self.matcher.accept_token(token_id)
        assert accepted, f"sampled token {token_id} was masked out by the grammar"

    def accept_forced(self, limit: int) -> list[int]:
        """The tokens the grammar forces next (at most `limit`), accepted; [] when none."""
        if limit < 1:
            return []
        forced = self.matcher.find_jump_forward_tokens()[:limit]
        for token_id in forced:
            accepted = self.matcher.accept_token(token_id)
            assert accepted, f"jump-forward token {token_id} was refused by the grammar"
        return forced

    @property
    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()


class StructuredOutputManager:
    def __init__(
        self,
        tokenizer: Tokenizer | None,  # None: a model without one; no grammar can be compiled
        model_vocab_size: int,
        config: StructuredOutputConfig | None = None,
    ) -> None:
        config = config or StructuredOutputConfig()
        self.vocab_size = model_vocab_size
        self.limits = config.schema_limits
        self.compile_timeout_s = config.grammar_compile_timeout_s
        max_compile_workers = config.grammar_compile_workers
        self._pool = None
        self._compiler = None
        self._bitmask = xgr.allocate_token_bitmask(1, model_vocab_size)
        # compile_async's compiles: one thread per compile worker, each waiting on its worker.
        self._closed = False
        self._compile_threads = ThreadPoolExecutor(
            max(1, max_compile_workers), thread_name_prefix="grammar-compile"
        )
        if tokenizer is None:
            self._info = None
            self.cache = GrammarCache(self._compile, CompiledGrammars(config.grammar_cache_bytes))
            return
        self._info = xgr.TokenizerInfo(
            tokenizer.vocab,
            _VOCAB_TYPES[tokenizer.vocab_type],
            vocab_size=model_vocab_size,
            stop_token_ids=sorted(tokenizer.stop_token_ids),
        )
        info_json = self._info.serialize_json().encode()
        # Grammars compiled by an earlier engine of this tokenizer (and settings) are reused.
        store = shared_grammars.store_for(
            info_json, self.compile_timeout_s, config.grammar_cache_bytes
        )
        self.cache = GrammarCache(self._compile, store)
        if max_compile_workers > 0:
            self._pool = shared_pools.acquire(
                info_json, max_compile_workers, self.compile_timeout_s
            )
        else:
            self._compiler = xgr.GrammarCompiler(self._info, max_threads=1, cache_enabled=False)

    def grammar_for(self, schema_text: str) -> GrammarState:
        """A matcher for the schema, compiled (or taken from the cache) in the caller's thread;
        ValueError for a schema over the limits, invalid, or past the compile deadline."""
        self._check(schema_text)
        return GrammarState(self.cache.get(schema_text))

    def compile_async(self, schema_text: str) -> tuple[Future[CompileOutcome], bool]:
        """Start compiling the schema on the compile threads, never the caller's: a future of
        its CompileOutcome, and whether this call started a compile (False: it was compiled,
        refused or under way already). A schema over the limits is refused in the outcome
        without compiling; the future raises only what is not the schema's fault (shut down)."""
        outcome: Future[CompileOutcome] = Future()
        if self._closed:
            outcome.set_exception(EngineShutDown())
            return outcome, False
        try:
            self._check(schema_text)
        except ValueError as exc:
            outcome.set_result(CompileOutcome(0.0, str(exc)))
            return outcome, False
        cached, is_started = self.cache.start(schema_text, self._compile_threads.submit)

        def finished(done: Future) -> None:
            compile_s = self.cache.compile_s(schema_text) if is_started else 0.0
            error = done.exception()
            if error is None or isinstance(error, ValueError):
                outcome.set_result(CompileOutcome(compile_s, str(error) if error else None))
            else:
                outcome.set_exception(error)

        cached.add_done_callback(finished)
        return outcome, is_started

    def is_known(self, schema_text: str) -> bool:
        """Whether the schema is compiled, refused or being compiled: asking for it starts
        no new compile."""
        return self.cache.is_known(schema_text)

    def _check(self, schema_text: str) -> None:
        if self._info is None:
            raise ValueError(
                "structured output (a JSON schema) needs the model's tokenizer: this model has "
                "none (no tokenizer.json in its directory)"
            )
        check_schema(schema_text, self.limits)

    def _compile(self, schema_text: str) -> xgr.CompiledGrammar:
        if self._pool is not None:
            compiled = self._pool.compile(schema_text)
            return xgr.CompiledGrammar.deserialize_json(compiled, self._info)
        return compile_in_thread(self._compiler, schema_text, self.compile_timeout_s)

    def start_workers(self, num_workers: int = 1) -> None:
        """Start compile workers now (seconds each: they import xgrammar), so that the first
        schemas do not wait for one. Nothing to start when compiling in this process."""
        if self._pool is not None and num_workers > 0:
            self._pool.start(num_workers)

    def close(self) -> None:
        """Release the compile workers (the engine shuts down; the last engine of this
        tokenizer stops them)."""
        # Queued compiles still run (or fail at once: the pool is closed) and answer their futures.
        self._closed = True
        self._compile_threads.shutdown(wait=False)
        if self._pool is not None:
            shared_pools.release(self._pool)

    def apply(
        self,
        logits: torch.Tensor,
        grammars: list[GrammarState | None],
        drafts: list[Sequence[int]] | None = None,
    ) -> dict[int, RequestError]:
        """Mask logits rows (N, vocab) in place for the rows that have a grammar; `drafts`: per
        row, the draft tokens before it (a verification step's rows: the grammar as if they
        were accepted). Returns the rows whose grammar failed (those rows are left unmasked:
        their request is failed)."""
        rows = [i for i, grammar in enumerate(grammars) if grammar is not None]
        if not rows:
            return {}
        if self._bitmask.shape[0] < len(grammars):
            self._bitmask = xgr.allocate_token_bitmask(len(grammars), self.vocab_size)
        bitmask = self._bitmask[: len(grammars)]
        failed: dict[int, RequestError] = {}
        for row in rows:
            try:
                grammars[row].fill_bitmask(bitmask, row, drafts[row] if drafts else ())
            except Exception as exc:
                failed[row] = RequestError(f"its grammar failed: {type(exc).__name__}: {exc}")
        rows = [row for row in rows if row not in failed]
        if rows:
            xgr.apply_token_bitmask_inplace(
                logits, bitmask.to(logits.device), vocab_size=self.vocab_size, indices=rows
            )
        return failed
