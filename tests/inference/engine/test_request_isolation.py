"""One request's failure stays its own: a fault while sampling, masking or advancing its grammar,
or checking its stop strings finishes that request with a RequestError (its KV blocks freed),
and the requests batched with it finish with the tokens they would have had without it. A bad
sampling parameter never gets that far: SamplingParams refuses it."""

from __future__ import annotations

import threading

import pytest

from inference.engine import LLMEngine, RequestError, SamplingParams
from inference.engine.runner import sampler as sampler_module
from inference.engine.structured_output.structured_output import GrammarState

SCHEMA = {
    "type": "object",
    "properties": {"go": {"type": "string", "maxLength": 24}},
    "required": ["go"],
}
PROMPTS = [f"Resident {name} wakes up and decides to" for name in ("Aki", "Ben", "Chie", "Dai")]
FAULTY = 2  # the index of the request the fault is injected into


def _params(index: int, place: str) -> SamplingParams:
    """Greedy for all; the faulty one carries what its fault place needs (a seed to be sampled,
    a grammar, a stop string)."""
    fields: dict = dict(max_tokens=10, temperature=0.0, ignore_eos=True)
    if index == FAULTY and place == "sampling":
        fields.update(temperature=0.8, seed=7)
    if place.startswith("grammar"):
        fields.update(json_schema=SCHEMA)
    if index == FAULTY and place == "stop":
        fields.update(stop=["never-in-the-output"])
    return SamplingParams(**fields)


def _run_concurrently(engine: LLMEngine, place: str) -> list[list[int] | BaseException]:
    results: list[list[int] | BaseException] = [None] * len(PROMPTS)  # type: ignore[list-item]
    barrier = threading.Barrier(len(PROMPTS))

    def one(index: int) -> None:
        barrier.wait()
        try:
            (out,) = engine.generate([PROMPTS[index]], _params(index, place))
            results[index] = out.token_ids
        except BaseException as exc:
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def _inject(monkeypatch, engine: LLMEngine, place: str) -> None:
    """Raise, the third time it runs for the faulty request only, inside the engine loop."""
    calls = {"n": 0}

    def third_call() -> bool:
        calls["n"] += 1
        return calls["n"] == 3

    if place == "sampling":
        real = sampler_module._sample_row

        def sample_row(logits, p, generator):
            if p.seed == 7 and third_call():
                raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
            return real(logits, p, generator)

        monkeypatch.setattr(sampler_module, "_sample_row", sample_row)
    elif place.startswith("grammar"):
        name = "fill_bitmask" if place == "grammar_mask" else "accept"
        real = getattr(GrammarState, name)

        def wrapped(self, *args):
            if getattr(self, "_is_faulty", False) and third_call():
                raise RuntimeError(f"matcher {name} failed")
            return real(self, *args)

        real_init = GrammarState.__init__
        made = {"n": 0}

        def init(self, compiled):
            real_init(self, compiled)
            made["n"] += 1
            self._is_faulty = made["n"] == 1  # the first request to arrive gets the fault

        monkeypatch.setattr(GrammarState, name, wrapped)
        monkeypatch.setattr(GrammarState, "__init__", init)
    elif place == "stop":
        real = engine.scheduler.check_stop

        def check_stop(request, token):
            if request.sampling_params.stop_list and third_call():
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
            return real(request, token)

        monkeypatch.setattr(engine.scheduler, "check_stop", check_stop)


@pytest.mark.parametrize("place", ["sampling", "grammar_mask", "grammar_accept", "stop"])
def test_a_fault_in_one_request_fails_it_alone(make_tiny_engine, monkeypatch, place):
    engine = make_tiny_engine(max_num_seqs=8)
    expected = _run_concurrently(engine, place)
    assert all(isinstance(tokens, list) for tokens in expected), expected
    usage = engine.stats().kv_cache_usage

    _inject(monkeypatch, engine, place)
    results = _run_concurrently(engine, place)
    monkeypatch.undo()

    failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert len(failed) == 1, results
    error = results[failed[0]]
    assert isinstance(error, RequestError) and "failed in the engine" in str(error)
    if not place.startswith("grammar"):  # with a grammar each, the first to arrive is faulty
        assert failed == [FAULTY]
    for index, tokens in enumerate(results):
        if index not in failed:
            assert tokens == expected[index], (index, place)
    # Its blocks were freed, and the engine goes on serving.
    assert engine.stats().kv_cache_usage <= usage + 1e-9
    assert engine.stats().num_running == 0
    (again,) = engine.generate([PROMPTS[0]], _params(0, place))
    assert again.token_ids == expected[0]


def test_a_failing_model_step_fails_its_requests_not_the_waiting_ones(
    make_tiny_engine, monkeypatch
):
    engine = make_tiny_engine(max_num_seqs=1)  # one at a time: the others only wait
    real = engine.runner.execute
    calls = {"n": 0}

    def execute(output):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(output)

    monkeypatch.setattr(engine.runner, "execute", execute)
    results = _run_concurrently(engine, "none")
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(failed) == 1 and "illegal memory access" in str(failed[0])
    assert sum(isinstance(r, list) and len(r) == 10 for r in results) == 3


def test_a_failed_step_leaves_no_unwritten_block_in_the_prefix_cache(make_tiny_engine, monkeypatch):
    engine = make_tiny_engine()
    uncached = make_tiny_engine(enable_prefix_caching=False)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompt = "Ben the bookseller counts the new arrivals before the shop opens, " * 4
    (want,) = uncached.generate([prompt], params)
    real = engine.runner.execute

    def fail_once(output):
        monkeypatch.setattr(engine.runner, "execute", real)
        raise RuntimeError("the forward failed before writing its K/V")

    monkeypatch.setattr(engine.runner, "execute", fail_once)
    with pytest.raises(RequestError, match="the forward failed"):
        engine.generate([prompt], params)
    # Its blocks were registered when allocated; a hit on them would read K/V never written.
    (again,) = engine.generate([prompt], params)
    assert again.metrics.num_cached_tokens == 0
    assert again.token_ids == want.token_ids


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"temperature": "0.5"}, "temperature must be a finite number"),
        ({"temperature": True}, "temperature must be a finite number"),
        ({"top_p": float("nan")}, "top_p must be a finite number"),
        ({"top_p": float("-inf")}, "top_p must be a finite number"),
        ({"max_tokens": 2.0}, "max_tokens must be an integer"),
        ({"top_k": "3"}, "top_k must be an integer"),
        ({"seed": 1.5}, "seed must be an integer"),
    ],
)
def test_bad_sampling_parameters_are_refused_naming_them(fields, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**fields)


@pytest.mark.parametrize("temperature", [1e-300, 1e-6])
def test_a_tiny_temperature_is_greedy(tiny_engine, temperature):
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    tiny = SamplingParams(max_tokens=8, temperature=temperature, ignore_eos=True)
    assert tiny.is_greedy
    (want,) = tiny_engine.generate([PROMPTS[0]], greedy)
    (got,) = tiny_engine.generate([PROMPTS[0]], tiny)
    assert got.token_ids == want.token_ids


def test_a_v4_request_whose_blocks_miss_its_span_fails_alone(make_v4_engine, monkeypatch):
    """A request whose block table does not cover its step's span (here: its full or its window
    table emptied on its first decode step) is left out of the step with an error naming it;
    the other request in the same step gets the greedy tokens it gets alone."""
    engine = make_v4_engine()
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    alone = [engine.generate([prompt], params)[0].token_ids for prompt in PROMPTS[:2]]
    for table in ("full", "window"):
        corrupted, results = _corrupt_one_of_two(engine, monkeypatch, params, table)
        failed = [i for i, r in enumerate(results) if isinstance(r, RequestError)]
        assert len(failed) == 1, results
        message = str(results[failed[0]])
        assert f"request {corrupted} failed" in message
        assert ("full-group blocks" if table == "full" else "window blocks") in message
        (other,) = {0, 1} - set(failed)
        assert results[other] == alone[other], table
        assert engine.stats().num_running == 0
        assert engine.generate([PROMPTS[failed[0]]], params)[0].token_ids == alone[failed[0]]


def _corrupt_one_of_two(engine, monkeypatch, params, table: str):
    """Run PROMPTS[0] and [1] together; empty one's `table` on the first step decoding both."""
    real = engine.scheduler.schedule
    corrupted: list[str] = []

    def schedule():
        output = real()
        decoding = [s for s in output.scheduled if s.request.output_token_ids]
        if not corrupted and len(decoding) == 2:
            victim = decoding[1]
            corrupted.append(victim.request.request_id)
            if table == "full":
                victim.block_ids = []
            else:
                victim.window_block_ids = (victim.window_block_ids[0], [])
        return output

    monkeypatch.setattr(engine.scheduler, "schedule", schedule)
    results: list = [None, None]
    barrier = threading.Barrier(2)

    def one(index: int) -> None:
        barrier.wait()
        try:
            results[index] = engine.generate([PROMPTS[index]], params)[0].token_ids
        except RequestError as exc:
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    monkeypatch.undo()
    assert len(corrupted) == 1, "no step decoded both requests"
    return corrupted[0], results
