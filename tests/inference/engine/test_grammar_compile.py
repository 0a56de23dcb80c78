"""Grammar compilation: off the engine's lock, once per schema, killed past its deadline."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time

import pytest

from inference.engine import SamplingParams

TRIVIAL = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _slow_schema(tag: str) -> dict:
    """Within every SchemaLimits default, yet seconds to compile: each property's nested
    bounded repetition (10 × 10 of a class that matches much of the vocabulary) takes xgrammar
    ~2.7 s on the 2-core machine; the tag makes each test's schema its own."""
    pattern = "^([a-z]{1,10}){1,10}$"
    properties = {f"{tag}{i}": {"type": "string", "pattern": pattern} for i in range(2)}
    return {"type": "object", "properties": properties, "required": list(properties)}


def test_a_slow_schema_does_not_delay_another_callers_trivial_one(make_tiny_engine):
    engine = make_tiny_engine(grammar_compile_workers=2)
    engine.structured.start_workers(2)  # both ready: the test measures compiling, not startup
    finished: list[str] = []

    def slow() -> None:
        engine.generate("hi", SamplingParams(max_tokens=4, json_schema=_slow_schema("slow")))
        finished.append("slow")

    thread = threading.Thread(target=slow)
    thread.start()
    deadline = time.monotonic() + 30
    while engine.structured.cache.num_compiling == 0:  # the slow compile has begun
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (output,) = engine.generate("hi", SamplingParams(max_tokens=16, json_schema=TRIVIAL))
    finished.append("trivial")
    # The trivial request was compiled, scheduled and finished while the slow one compiled.
    assert engine.structured.cache.num_compiling == 1
    thread.join(timeout=120)
    assert finished == ["trivial", "slow"]
    assert "n" in json.loads(output.text)


def test_the_compile_deadline_kills_a_compile_that_runs_past_it(make_tiny_engine):
    engine = make_tiny_engine(grammar_compile_timeout_s=0.5, grammar_compile_workers=1)
    engine.structured.start_workers(1)
    schema = _slow_schema("late")
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"did not compile within the 0\.5 s deadline"):
        engine.generate("hi", SamplingParams(max_tokens=4, json_schema=schema))
    assert time.perf_counter() - started < 5.0  # killed at 0.5 s, not compiled to the end
    # Asked again, it is refused at once (the refusal is cached), and the pool's one seat is
    # free again: a trivial schema compiles on a fresh worker.
    started = time.perf_counter()
    with pytest.raises(ValueError, match="deadline"):
        engine.generate("hi", SamplingParams(max_tokens=4, json_schema=schema))
    assert time.perf_counter() - started < 0.5
    (output,) = engine.generate("hi", SamplingParams(max_tokens=16, json_schema=TRIVIAL))
    assert "n" in json.loads(output.text)
    assert engine.structured.cache.num_compiles == 2


def test_the_same_schema_compiles_once_even_when_asked_for_at_once(make_tiny_engine):
    engine = make_tiny_engine(grammar_compile_workers=2)
    words = {"word": {"enum": ["melon", "pan", "anpan"]}}
    schema = {"type": "object", "properties": words, "required": ["word"]}
    outputs = []
    threads = [
        threading.Thread(
            target=lambda: outputs.extend(
                engine.generate("hi", SamplingParams(max_tokens=12, json_schema=schema))
            )
        )
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    engine.generate("hi", SamplingParams(max_tokens=12, json_schema=json.dumps(schema)))
    cache = engine.structured.cache
    # Four requests, one compile: the others waited for it or found it cached (which of the two
    # depends on when their threads ran).
    assert cache.num_compiles == 1 and 1 <= cache.num_hits <= 3
    assert len(outputs) == 3 and all(json.loads(o.text)["word"] for o in outputs)


def test_an_invalid_schema_is_a_clear_error_and_the_worker_stays(make_tiny_engine):
    engine = make_tiny_engine(grammar_compile_workers=1)
    with pytest.raises(ValueError, match="invalid json_schema"):
        engine.generate("hi", SamplingParams(max_tokens=4, json_schema={"type": "objekt"}))
    (output,) = engine.generate("hi", SamplingParams(max_tokens=16, json_schema=TRIVIAL))
    assert "n" in json.loads(output.text)


def test_the_in_process_deadline_counts_the_compiles_cpu_time_not_the_clock(make_tiny_engine):
    """Compiles that share a busy machine each take longer by the clock but no more work: none
    is refused while its own CPU time stays under the deadline (a town tick on Gemma 3 compiles
    several ~10 s schemas at once on two cores)."""
    probe = make_tiny_engine()
    before = resource.getrusage(resource.RUSAGE_SELF)
    probe.structured.grammar_for(json.dumps(_slow_schema("probe")))
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    engine = make_tiny_engine(grammar_compile_timeout_s=1.5 * cpu_s)
    # Every core busy, and three compiles at once: each gets well under half a core, so by the
    # clock each takes more than twice its CPU time.
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    refused: list[str] = []
    walls: list[float] = []

    def compile_one(tag: str) -> None:
        started = time.monotonic()
        try:
            engine.structured.grammar_for(json.dumps(_slow_schema(tag)))
        except ValueError as exc:
            refused.append(str(exc))
        walls.append(time.monotonic() - started)

    try:
        threads = [threading.Thread(target=compile_one, args=(f"busy{i}",)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    print(f"one compile: {cpu_s:.1f} s CPU; three at once, every core busy: {max(walls):.1f} s")
    assert max(walls) > 1.5 * cpu_s, "the machine was not busy enough to tell clock from CPU"
    assert refused == []


def test_a_compile_that_ends_before_its_clock_is_read_is_answered(make_tiny_engine):
    """A trivial schema can compile before the caller reads the compile thread's CPU clock; the
    thread is gone then (ProcessLookupError from pthread_getcpuclockid, seen in a full run as
    'the node failed the completion'), and the answer is still the compiled grammar."""
    engine = make_tiny_engine()
    for i in range(200):  # each a new schema, so none is served from the cache
        schema = {"type": "object", "properties": {f"k{i}": {"type": "integer"}}}
        assert engine.structured.grammar_for(json.dumps(schema)) is not None


def test_compile_time_is_its_own_metric_and_a_cached_schema_costs_none(make_tiny_engine):
    # issue 33, item 6: a decision's compile shows apart from queue / prefill / decode.
    engine = make_tiny_engine()
    schema = _slow_schema("metric")
    (first,) = engine.generate("hi", SamplingParams(max_tokens=4, json_schema=schema))
    (again,) = engine.generate("hi", SamplingParams(max_tokens=4, json_schema=schema))
    (plain,) = engine.generate("hi", SamplingParams(max_tokens=4))
    assert first.metrics.grammar_compile_s > 0.2  # seconds of xgrammar (see _slow_schema)
    assert again.metrics.grammar_compile_s < first.metrics.grammar_compile_s / 10  # the cache
    assert plain.metrics.grammar_compile_s == 0.0
    # Compiled before arrival: not counted again in the queue time.
    assert first.metrics.queue_s < first.metrics.grammar_compile_s


def test_work_after_shutdown_is_refused_as_engine_shut_down(make_tiny_engine):
    """A schema or a request handed to an engine that is shutting down fails as EngineShutDown
    (what a stopping worker logs as expected, not as a fault), never hangs."""
    from inference.engine import EngineShutDown

    engine = make_tiny_engine(grammar_compile_workers=1)
    engine.shutdown()
    future, _ = engine.compile_schema_async(_slow_schema("shut"))
    with pytest.raises(EngineShutDown):
        future.result(timeout=30)
    with pytest.raises(EngineShutDown):
        engine.generate("hi", SamplingParams(max_tokens=4))


def test_an_engine_built_after_another_of_the_same_model_finds_its_schemas_compiled(
    make_tiny_engine,
):
    """The experiment builds an engine per step: the second engine of the same tokenizer and
    compile settings reads the first one's grammars (and refusals); other settings compile."""
    words = {"word": {"enum": ["onigiri", "dango", "taiyaki"]}}
    schema = {"type": "object", "properties": words, "required": ["word"]}
    params = SamplingParams(max_tokens=12, temperature=0.0, json_schema=schema)
    first = make_tiny_engine()
    (compiled,) = first.generate("hi", params)
    with pytest.raises(ValueError, match="invalid json_schema"):
        first.generate("hi", SamplingParams(max_tokens=4, json_schema={"type": "objekt"}))
    first.shutdown()

    second = make_tiny_engine()
    (reused,) = second.generate("hi", params)
    with pytest.raises(ValueError, match="invalid json_schema"):
        second.generate("hi", SamplingParams(max_tokens=4, json_schema={"type": "objekt"}))
    assert (second.structured.cache.num_compiles, second.structured.cache.num_hits) == (0, 2)
    assert reused.token_ids == compiled.token_ids  # greedy, the same grammar: the same words

    # Another deadline is another store: a refusal past one deadline says nothing of another.
    other = make_tiny_engine(grammar_compile_timeout_s=7.0)
    other.generate("hi", params)
    assert other.structured.cache.num_compiles == 1
