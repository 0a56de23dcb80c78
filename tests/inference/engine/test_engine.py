"""LLMEngine end to end on the tiny random-weight model (real tokenizer and chat template)."""

import json
import random
import threading
import uuid

import pytest

from inference.engine import EngineConfig, LLMEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

DECISION_SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"enum": ["go", "stay", "talk"]},
        "target": {"enum": ["喫茶店", "本屋", "公園"]},
        "reason": {"type": "string", "maxLength": 30},
    },
    "required": ["action", "target", "reason"],
    "additionalProperties": False,
}


def salted(**kwargs) -> SamplingParams:
    """Params with a fresh cache salt: no hits from what earlier tests left in the cache."""
    return SamplingParams(cache_salt=uuid.uuid4().hex, **kwargs)


def test_prefix_caching_changes_nothing_but_speed(tiny_engine, tiny_engine_uncached):
    rng = random.Random(1234)
    base = [rng.randrange(5, 40000) for _ in range(200)]
    prompts = []
    for _ in range(6):
        shared = rng.randrange(1, len(base))
        prompts.append(
            base[:shared] + [rng.randrange(5, 40000) for _ in range(rng.randrange(1, 40))]
        )
    prompts.append(list(base[:96]))  # whole prompt cached once the first request has run
    prompts.append(list(base[:96]))
    params = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
    salt = uuid.uuid4().hex
    cached = [
        tiny_engine.generate(p, SamplingParams(cache_salt=salt, **params))[0]
        for p in [base, *prompts]
    ]
    uncached = tiny_engine_uncached.generate([base, *prompts], SamplingParams(**params))
    assert [o.token_ids for o in cached] == [o.token_ids for o in uncached]
    assert all(o.metrics.num_cached_tokens == 0 for o in uncached)
    block = tiny_engine.config.block_size
    assert cached[0].metrics.num_cached_tokens == 0
    for prompt, out in zip(prompts[:-1], cached[1:-1], strict=True):
        shared = 0
        while shared < min(len(prompt), len(base)) and prompt[shared] == base[shared]:
            shared += 1
        expected = min(shared, len(prompt) - 1)  # token-exact (partial-block copy)
        assert out.metrics.num_cached_tokens >= expected  # earlier prompts may have added blocks
    assert block == 16
    # The same 96 tokens again: all but the last (whose logits are needed), block 5's first 15
    # slots copied from the earlier prompt's block (its unfilled tail was cached at the end).
    assert cached[-1].metrics.num_cached_tokens == 95


def test_cached_tokens_equal_the_shared_prefix_exactly(tiny_engine, make_tiny_engine):
    salt = uuid.uuid4().hex
    head = list(range(100, 150))  # 50 tokens: 3 full blocks and 2 tokens
    params = SamplingParams(max_tokens=1, cache_salt=salt)
    tiny_engine.generate([*head, 7, 8, 9], params)
    out = tiny_engine.generate([*head, 1, 2, 3, 4], params)
    assert out[0].metrics.num_cached_tokens == 50  # 2 slots copied from the first one's tail
    rounding = make_tiny_engine(enable_partial_block_reuse=False)
    rounding.generate([*head, 7, 8, 9], params)
    out = rounding.generate([*head, 1, 2, 3, 4], params)
    assert out[0].metrics.num_cached_tokens == 48  # rounded down to the block


def test_json_schema_output_always_parses_and_validates(tiny_engine):
    messages = [
        [
            {"role": "system", "content": "町の住人です。"},
            {"role": "user", "content": f"{i}: どこへ?"},
        ]
        for i in range(4)
    ]
    params = SamplingParams(max_tokens=80, temperature=1.0, seed=3, json_schema=DECISION_SCHEMA)
    for out in tiny_engine.generate(messages, params):
        assert out.finish_reason == "stop", out.text
        decision = json.loads(out.text)
        assert set(decision) == {"action", "target", "reason"}
        assert decision["action"] in ("go", "stay", "talk")
        assert decision["target"] in ("喫茶店", "本屋", "公園")
        assert len(decision["reason"]) <= 30


def test_same_seed_same_output_whatever_the_batch(tiny_engine):
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=42)
    alone = tiny_engine.generate("町の朝", params)[0].token_ids
    batched = tiny_engine.generate(["町の朝", "別の話", "町の朝"], params)
    assert batched[0].token_ids == alone
    assert batched[2].token_ids == alone
    other = tiny_engine.generate("町の朝", SamplingParams(max_tokens=16, temperature=1.0, seed=43))
    assert other[0].token_ids != alone


def test_max_tokens_and_stop_strings(tiny_engine):
    out = tiny_engine.generate("hello", GREEDY)[0]
    assert len(out.token_ids) == 12 and out.finish_reason == "length"
    stop = out.text[len(out.text) // 2 :][:3]
    stopped = tiny_engine.generate(
        "hello", SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop=[stop])
    )[0]
    assert stopped.finish_reason == "stop"
    assert stop not in stopped.text
    assert out.text.startswith(stopped.text)


def test_prompt_kinds_strings_ids_and_chat_messages(tiny_engine):
    messages = [{"role": "user", "content": "こんにちは", "cache": True}]
    ids = tiny_engine.tokenizer.apply_chat_template(messages)
    by_messages, by_ids = tiny_engine.generate([messages, ids], GREEDY)
    assert by_messages.prompt_token_ids == ids
    assert by_messages.token_ids == by_ids.token_ids
    text = tiny_engine.generate("plain text", GREEDY)[0]
    assert text.prompt_token_ids == tiny_engine.tokenizer.encode("plain text")


def test_metrics_follow_the_vllm_definitions(tiny_engine):
    m = tiny_engine.generate("metrics please", salted(max_tokens=5, ignore_eos=True))[0].metrics
    assert m.num_output_tokens == 5
    assert m.num_prompt_tokens == len(tiny_engine.tokenizer.encode("metrics please"))
    assert min(m.queue_s, m.prefill_s, m.decode_s) >= 0
    assert m.ttft_s == pytest.approx(m.queue_s + m.prefill_s)
    assert m.e2e_s == pytest.approx(m.ttft_s + m.decode_s)
    stats = tiny_engine.stats()
    assert stats.prefix_cache_queries >= m.num_prompt_tokens
    assert stats.num_running == 0 and stats.num_waiting == 0


def test_threads_calling_generate_at_once_are_batched_and_correct(tiny_engine):
    prompts = [f"resident {i} wakes up" for i in range(8)]
    expected = {p: tiny_engine.generate(p, GREEDY)[0].token_ids for p in prompts}
    steps_before = tiny_engine.stats().num_steps
    results = {}

    def call(prompt):
        results[prompt] = tiny_engine.generate(prompt, GREEDY)[0].token_ids

    threads = [threading.Thread(target=call, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected
    # 8 prompts × 12 tokens one at a time would take ≥ 96 steps.
    assert tiny_engine.stats().num_steps - steps_before < 96


def test_preemption_under_memory_pressure_gives_the_same_answers(make_tiny_engine, tiny_engine):
    small = make_tiny_engine(num_kv_blocks=12, max_num_batched_tokens=64)
    rng = random.Random(7)
    prompts = [[rng.randrange(5, 40000) for _ in range(60)] for _ in range(4)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    outs = small.generate(prompts, params)
    assert small.stats().num_preemptions > 0
    reference = tiny_engine.generate(prompts, SamplingParams(cache_salt="ref", **_fields(params)))
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]


def _fields(params: SamplingParams) -> dict:
    return dict(max_tokens=params.max_tokens, temperature=params.temperature, ignore_eos=True)


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        (list(range(9000)), SamplingParams(), "context"),
        ("hi", SamplingParams(json_schema='{"type": "objekt"}'), "json_schema"),
        ("hi", SamplingParams(json_schema="{not json"), "json_schema"),
        ([{"role": "wizard", "content": "x"}], SamplingParams(), "role"),
        ([1.5, 2.5], SamplingParams(), "prompt"),
        ([10**9], SamplingParams(), "token ids"),
        ("", SamplingParams(), "empty"),
    ],
)
def test_bad_input_is_a_value_error_and_the_engine_keeps_serving(
    tiny_engine, prompt, params, message
):
    with pytest.raises(ValueError, match=message):
        tiny_engine.generate(prompt, params)
    assert tiny_engine.generate("still alive", GREEDY)[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(stop=[""]), "stop"),
    ],
)
def test_bad_sampling_params_say_what_to_change(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_unknown_model_and_bad_config_are_value_errors():
    with pytest.raises(ValueError, match="unknown model"):
        LLMEngine(EngineConfig(model="gpt-17"))
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(block_size=12)


def test_prompt_that_cannot_fit_the_kv_cache_is_rejected(make_tiny_engine):
    small = make_tiny_engine(num_kv_blocks=4)
    with pytest.raises(ValueError, match="KV blocks"):
        small.generate(list(range(100, 160)), SamplingParams(max_tokens=20))


def test_decoding_requests_sharing_a_head_match_the_uncached_engine(
    tiny_engine, tiny_engine_uncached
):
    # Four requests decode together over a 96-token shared head: the head's K/V is read once
    # per step for all of them (shared-prefix attention) and must change nothing.
    rng = random.Random(99)
    head = [rng.randrange(5, 40000) for _ in range(96)]
    prompts = [head + [rng.randrange(5, 40000) for _ in range(3 + 7 * i)] for i in range(4)]
    params = dict(max_tokens=20, temperature=0.0, ignore_eos=True)
    salt = uuid.uuid4().hex
    tiny_engine.generate([*head, 1], SamplingParams(max_tokens=1, cache_salt=salt))
    cached = tiny_engine.generate(prompts, SamplingParams(cache_salt=salt, **params))
    uncached = tiny_engine_uncached.generate(prompts, SamplingParams(**params))
    assert [o.metrics.num_cached_tokens for o in cached] == [96] * 4
    assert [o.token_ids for o in cached] == [o.token_ids for o in uncached]
