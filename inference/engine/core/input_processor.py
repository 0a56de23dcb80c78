"""InputProcessor: a caller's prompt and SamplingParams become a checked Request (vLLM's
Processor), on the caller's thread: tokenized (text, token ids or chat messages), its cache
breakpoints gathered, checked against the context and the KV cache, its grammar looked up, its
sampling seed drawn.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch

from inference.engine.config import EngineConfig
from inference.engine.kv.breakpoints import chat_breakpoints, check_breakpoints
from inference.engine.request import Request
from inference.engine.sampling_params import SamplingParams
from inference.engine.structured_output.structured_output import StructuredOutputManager

Prompt = str | list[int] | list[dict[str, Any]]


class InputProcessor:
    def __init__(
        self,
        config: EngineConfig,
        tokenizer,
        structured: StructuredOutputManager,
        *,
        max_model_len: int,
        num_blocks: int,
    ) -> None:
        self.model = config.model
        self.block_size = config.cache.block_size
        self.enable_chat_breakpoints = config.cache.enable_chat_breakpoints
        self.tokenizer = tokenizer
        self.structured = structured
        self.max_model_len = max_model_len
        self.num_blocks = num_blocks
        self._ids = itertools.count()
        self._seed_rng = torch.Generator().manual_seed(config.seed)

    def make_request(self, prompt: Prompt, params: SamplingParams, priority: int = 0) -> Request:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an int (lower is served first), not {priority!r}")
        token_ids = self.tokenize(prompt)
        if self.tokenizer is None and params.stop_list:
            raise ValueError(self._no_tokenizer("stop strings"))
        if not token_ids:
            raise ValueError("prompt is empty")
        breakpoints = check_breakpoints(params.cache_breakpoints, len(token_ids))
        is_chat = isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)
        if is_chat and self.enable_chat_breakpoints:
            marked = chat_breakpoints(self.tokenizer, prompt, token_ids)
            breakpoints = sorted({*breakpoints, *marked})
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens; the model's context is {self.max_model_len} "
                "(prompt plus at least one output token): shorten the prompt"
            )
        vocab = self.structured.vocab_size
        if any(not 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        max_len = min(len(token_ids) + params.max_tokens, self.max_model_len)
        needed_blocks = -(-max_len // self.block_size)
        if needed_blocks > self.num_blocks:
            raise ValueError(
                f"prompt plus max_tokens needs {needed_blocks} KV blocks but the cache holds "
                f"{self.num_blocks}: raise kv_cache_memory_bytes or lower max_tokens"
            )
        schema = params.json_schema_text()
        compile_started = time.perf_counter()
        grammar = self.structured.grammar_for(schema) if schema is not None else None
        grammar_compile_s = time.perf_counter() - compile_started if grammar is not None else 0.0
        seed = params.seed
        if seed is None and not params.is_greedy:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_rng))
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        return Request(
            request_id=str(next(self._ids)),
            prompt_token_ids=token_ids,
            sampling_params=params,
            grammar=grammar,
            generator=generator,
            cache_breakpoints=breakpoints,
            grammar_compile_s=grammar_compile_s,
            priority=priority,
        )

    def tokenize(self, prompt: Prompt, add_generation_prompt: bool = True) -> list[int]:
        if self.tokenizer is None and not (
            isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        ):
            raise ValueError(self._no_tokenizer("text and chat prompts"))
        if isinstance(prompt, str):
            # With the BOS the model's GGUF asks for (Gemma: yes; SmolLM2: no), as transformers.
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
            return self.tokenizer.apply_chat_template(prompt, add_generation_prompt)
        raise ValueError(
            "a prompt must be a string, a list of token ids, or a list of chat messages "
            '[{"role": ..., "content": ...}]'
        )

    def _no_tokenizer(self, what: str) -> str:
        return (
            f"{self.model} has no tokenizer (no tokenizer.json in its directory): "
            f"{what} need one; give prompts as token ids, or add the model's tokenizer.json "
            "and tokenizer_config.json"
        )


def is_single_prompt(prompts: Any) -> bool:
    if isinstance(prompts, str):
        return True
    return isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], (int, dict))
