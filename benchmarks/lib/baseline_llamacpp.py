"""The fast CPU peer: llama.cpp (llama-cpp-python), on the same GGUF file the engine loads,
one request at a time as its users run it, in the same bench run.

An optional extra (pip install -e '.[llamacpp]'; it builds llama.cpp from source): imported
here, lazily, and nowhere else. It runs the engine's own rendered prompt tokens, unconstrained
(no schema), greedy, each request forced to the engine's output length for it (end-of-text
masked), so both do the same work. llama-cpp-python keeps the previous prompt's KV and
evaluates only what follows the longest common prefix with it: its own prefix reuse, which
this run keeps (the shared head is computed once, a tick-2 prompt resumes after tick 1's
head only when it directly follows it).
"""

from __future__ import annotations

import contextlib
import os
import time

from benchmarks.lib.results import RequestRecord, RunResult
from benchmarks.lib.workload import Workload
from inference.engine.loading.model_files import TINY_RANDOM_MODELS, gguf_path_for
from inference.engine.loading.tokenizer import Tokenizer

NAME = "llamacpp"


def is_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def run_llamacpp(
    workload: Workload,
    *,
    model: str,
    tokenizer: Tokenizer,
    output_token_counts: list[int],
    num_threads: int | None = None,
) -> RunResult:
    """Greedy-generate every request of `workload`, request i making exactly
    `output_token_counts[i]` tokens."""
    if model in TINY_RANDOM_MODELS:
        raise ValueError(f"the llama.cpp run needs real weights; {model!r} is a random test model")
    try:
        import llama_cpp
        import numpy as np
    except ImportError as exc:
        raise ValueError(
            "the llama.cpp run needs the llamacpp extra: pip install -e '.[llamacpp]'"
        ) from exc
    path = gguf_path_for(model)
    threads = num_threads or os.cpu_count() or 1
    longest = max(workload.prompt_token_counts) + max(output_token_counts) + 16
    with _without_amx_repacking(llama_cpp):
        llm = _load(llama_cpp, path, longest, threads)
    stop_ids = sorted(tokenizer.stop_token_ids | {llm.token_eos()})

    def no_stop(_, scores):
        scores[stop_ids] = -np.inf
        return scores

    def generate(prompt: list[int], num_tokens: int) -> RequestRecord:
        start = time.perf_counter()
        times, texts, finished = [], [], False
        for chunk in llm.create_completion(
            prompt,
            max_tokens=num_tokens,
            temperature=0.0,
            top_k=1,
            stream=True,
            logits_processor=llama_cpp.LogitsProcessorList([no_stop]),
        ):
            choice = chunk["choices"][0]
            texts.append(choice["text"])
            if choice["finish_reason"] is not None:  # the closing chunk, after the last token
                finished = True
                break
            times.append(time.perf_counter())
        assert finished and times, "llama.cpp's stream ended without its closing chunk"
        first, last = times[0], times[-1]
        return RequestRecord(
            num_prompt_tokens=len(prompt),
            num_cached_tokens=0,  # llama.cpp does not say how much it reused
            num_output_tokens=len(times),
            queue_s=0.0,
            prefill_s=first - start,
            decode_s=last - first,
            e2e_s=last - start,
            text="".join(texts),
            finish_reason="length",
        )

    prompts = [tokenizer.apply_chat_template(messages) for messages in workload.requests]
    generate(tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}]), 2)  # warm-up
    start = time.perf_counter()
    records = [generate(p, n) for p, n in zip(prompts, output_token_counts, strict=True)]
    return RunResult(
        name=NAME,
        description=f"llama.cpp {llama_cpp.__version__} ({path.name}), greedy, one at a time",
        records=records,
        wall_s=time.perf_counter() - start,
        schema=None,
        notes=[
            "llama.cpp runs unconstrained (no schema), each request forced to the engine's "
            "output length for it; it reuses the previous prompt's KV up to their common prefix",
        ],
    )


def _load(llama_cpp, path, longest: int, threads: int):
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=longest,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )


@contextlib.contextmanager
def _without_amx_repacking(llama_cpp):
    """On a CPU with AMX, llama.cpp repacks the weights into its AMX buffer, and its AMX
    matmul segfaults on the first prompt (llama.cpp issue #20824, seen here on an Intel Xeon
    with amx_int8 with SmolLM2's Q4_1 file). There, load the model without the extra buffer
    types (`use_extra_bufts=False`): the plain CPU kernels. Elsewhere nothing changes."""
    if not _cpu_has_amx():
        yield
        return
    low_level = llama_cpp.llama_cpp  # the ctypes module Llama() reads its defaults from
    defaults = low_level.llama_model_default_params

    def without_extra_bufts():
        params = defaults()
        params.use_extra_bufts = False
        return params

    low_level.llama_model_default_params = without_extra_bufts
    try:
        yield
    finally:
        low_level.llama_model_default_params = defaults


def _cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return "amx_int8" in f.read()
    except OSError:
        return False
