"""DeepSeek-V4's MTP layer as the draft (speculative_method="mtp") on deepseek-v4-tiny-random:
the drafts the engine makes step by step (prefill in chunks, then verification steps, its own
sliding window kept by position) are those of the layer run over the whole sequence at once;
and the output is the same tokens as without drafts, batched, with prefix caching and under
preemption. Random weights: drafts are (almost) never accepted; exactness is what is tested."""

from __future__ import annotations

import random

import torch

from inference.engine import SamplingParams
from tests.inference.engine.helpers import smollm2_tokens, v4_one_pass

MTP = dict(speculative_method="mtp")
BLOCK = 16


def one_pass_drafts(model, ids: list[int], rows: list[int]) -> list[int]:
    """The MTP layer's greedy token at `rows`, the model and the layer over `ids` in one step
    on fresh state (each row's next token: the following id)."""
    (_, context), state = v4_one_pass(model, ids, rows, BLOCK, keep_for_draft=True)
    next_ids = torch.tensor([*ids[1:], 0])
    logits = model.draft_logits(context, next_ids, state.mtp_layer, torch.tensor(rows))
    return logits.argmax(dim=-1).tolist()


def test_step_by_step_drafts_are_the_one_pass_drafts(make_v4_engine):
    engine = make_v4_engine(**MTP, max_num_batched_tokens=100, enable_prefix_caching=False)
    made: list[dict[str, list[int]]] = []
    take = engine.runner.take_drafts

    def recorded() -> dict[str, list[int]]:  # the engine's own drafts, kept as they pass
        drafts = take()
        made.append(drafts)
        return drafts

    engine.runner.take_drafts = recorded
    prompt = smollm2_tokens(random.Random(7), 230)  # chunks of 100: 100, 100, 30
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    (output,) = engine.generate([prompt], params)
    assert output.metrics.num_accepted_tokens == 0  # so each step appends one token
    drafts = [d[output.request_id][0] for d in made if output.request_id in d]
    assert len(drafts) == 12  # the last prefill chunk, then one per verification step
    assert output.metrics.num_draft_tokens == 10  # none when only one token may follow
    sequence = prompt + output.token_ids
    rows = list(range(len(prompt) - 1, len(sequence) - 1))
    assert drafts == one_pass_drafts(engine.runner.model, sequence, rows)


def _same_outputs(make, prompts, params, **overrides):
    plain = make(**overrides)
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    drafted = make(**overrides, **MTP)
    outputs = drafted.generate(prompts, params)
    assert [o.token_ids for o in outputs] == expected
    return drafted.stats()


def test_outputs_are_unchanged_batched_and_with_prefix_caching(make_v4_engine):
    rng = random.Random(8)
    head = smollm2_tokens(rng, 140)
    prompts = [head + smollm2_tokens(rng, 30), head + smollm2_tokens(rng, 50)]
    prompts.append(smollm2_tokens(rng, 20))
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    stats = _same_outputs(make_v4_engine, prompts, params)
    assert stats.num_draft_tokens >= 3 * 19 - 3  # a draft nearly every step of every request
    assert stats.prefix_cache_hits > 0


def test_outputs_are_unchanged_under_preemption(make_v4_engine):
    rng = random.Random(9)
    prompts = [smollm2_tokens(rng, 60) for _ in range(3)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    stats = _same_outputs(make_v4_engine, prompts, params, num_kv_blocks=14, max_num_seqs=3)
    assert stats.num_preemptions > 0 and stats.num_draft_tokens > 0
