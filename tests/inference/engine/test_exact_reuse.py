"""Reuse that never rounds down (gemma3-tiny-random: 5 sliding layers, window 512, 1 global):
declared breakpoints reuse the talk's whole heads at every retention interval; random
divergence points are reused exactly (junctions); outputs equal the uncached engine's."""

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from inference.engine import SamplingParams
from tests.inference.engine.helpers import random_tokens


@pytest.mark.parametrize("interval", [4096, 2048, 1024, None, 0])
def test_a_breakpoint_reuses_the_talks_whole_heads_at_every_interval(make_hybrid_engine, interval):
    engine = make_hybrid_engine(retention_interval=interval)
    for head in (2247, 3362):
        rng = random.Random(head)
        shared = random_tokens(rng, head)
        params = SamplingParams(max_tokens=1, temperature=0.0, cache_breakpoints=[head])
        metrics = [engine.generate(shared + random_tokens(rng, 40), params)[0].metrics]
        metrics += [engine.generate(shared + random_tokens(rng, 40), params)[0].metrics]
        metrics += [engine.generate(shared + random_tokens(rng, 40), params)[0].metrics]
        assert metrics[0].num_cached_tokens == 0 and metrics[0].reuse_source == "none"
        for m in metrics[1:]:
            assert m.num_cached_tokens == head, (interval, head)
            assert m.num_lost_to_retention == m.num_lost_to_alignment == 0
            assert m.reuse_source == "breakpoint"
    assert engine.stats().num_partial_block_copies >= 4


def test_without_the_partial_block_copy_a_breakpoint_rounds_to_the_block(make_hybrid_engine):
    engine = make_hybrid_engine(retention_interval=2048, enable_partial_block_reuse=False)
    for head, rounded in ((2247, 2240), (3362, 3360)):
        rng = random.Random(head)
        shared = random_tokens(rng, head)
        params = SamplingParams(max_tokens=1, temperature=0.0, cache_breakpoints=[head])
        engine.generate(shared + random_tokens(rng, 40), params)
        second = engine.generate(shared + random_tokens(rng, 40), params)[0].metrics
        assert second.num_cached_tokens == rounded
        assert (second.num_lost_to_retention, second.num_lost_to_alignment) == (0, head - rounded)


def _run_all(engine, jobs):
    """jobs: (prompt, params); run at once (batched together), outputs in order."""
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(lambda job: engine.generate(*job)[0], jobs))


def test_random_divergence_points_are_reused_exactly(make_hybrid_engine):
    """≥ 200 trials over block sizes and intervals. Per trial a head of random length S, then
    prompts A, B, C that share exactly S tokens, in that order. With a breakpoint at S on A, B
    resumes at S; without, B finds the junction at S and keeps a checkpoint there, so C does
    (dense retention keeps the window at every token: B resumes at S with no junction).
    Full-attention model: B resumes at S with no checkpoint at all. Greedy outputs equal the
    uncached engine's."""
    uncached = make_hybrid_engine(enable_prefix_caching=False, max_num_batched_tokens=4096)
    rng = random.Random(4)
    # (block size, retention interval); few engines, as each takes seconds to build.
    configs = [(4, None), (8, 0), (16, 64), (32, 512), (16, 2048)]
    num_trials = 0
    for block_size, interval in configs:
        engine = make_hybrid_engine(
            block_size=block_size,
            retention_interval=interval,
            num_kv_blocks=60_000 // block_size,
            max_num_batched_tokens=4096,
            max_num_seqs=40,
        )
        trials = []
        for _ in range(40):
            shared = rng.randrange(1, 600)
            head = random_tokens(rng, shared)
            tails = [random_tokens(rng, rng.randrange(1, 30)) for _ in range(3)]
            while len({t[0] for t in tails}) < 3:  # the prompts part exactly at S
                tails = [random_tokens(rng, rng.randrange(1, 30)) for _ in range(3)]
            trials.append((shared, [head + t for t in tails], rng.random() < 0.5))
        outputs = []
        for step in range(3):
            jobs = []
            for shared, prompts, declared in trials:
                bp = [shared] if declared and step == 0 else None
                jobs.append(
                    (
                        prompts[step],
                        SamplingParams(max_tokens=3, temperature=0.0, cache_breakpoints=bp),
                    )
                )
            outputs.append(_run_all(engine, jobs))
        reference = _run_all(
            uncached,
            [(p, SamplingParams(max_tokens=3, temperature=0.0)) for _, ps, _ in trials for p in ps],
        )
        for index, (shared, _, declared) in enumerate(trials):
            a, b, c = (outputs[step][index] for step in range(3))
            assert a.metrics.num_cached_tokens == 0
            if declared or interval is None:  # dense: the window is kept at every token
                assert b.metrics.num_cached_tokens == shared, (block_size, interval, shared)
            assert c.metrics.num_cached_tokens == shared, (block_size, interval, shared, declared)
            assert [o.token_ids for o in (a, b, c)] == [
                r.token_ids for r in reference[3 * index : 3 * index + 3]
            ]
            num_trials += 1
        # Dense needs no junction: b resumes where it leaves a, c where it leaves a and b.
        assert (engine.stats().num_junction_checkpoints > 0) == (interval is not None)
    assert num_trials >= 200


def test_dense_retention_resumes_exactly_where_a_prompt_leaves_a_cached_one(make_hybrid_engine):
    """Dense retention keeps every block of the window, so the window's state at every token.
    The town's case: residents' own parts share a turn header and a few words past the shared
    head's breakpoint; one arriving after the first has computed past that point finds no
    junction kept there, yet resumes exactly where it leaves the cached prompt (not at the
    breakpoint, losing the rest to retention). A prompt that continues a whole earlier prompt
    resumes at its end, inside its unfilled last block. Outputs equal the uncached engine's."""
    rng = random.Random(21)
    head, leaves = 980, 987  # the breakpoint, and where b leaves a: inside block 61 (976..991)
    a = random_tokens(rng, 1300)
    b = a[:leaves] + random_tokens(rng, 40)
    c = a + random_tokens(rng, 30)
    assert b[leaves] != a[leaves] and len(a) % 16
    greedy = dict(max_tokens=4, temperature=0.0, ignore_eos=True)
    params = SamplingParams(**greedy)
    engine = make_hybrid_engine(retention_interval=None)
    outs = [engine.generate(a, SamplingParams(**greedy, cache_breakpoints=[head]))[0]]
    outs += [engine.generate(p, params)[0] for p in (b, c)]
    assert [o.metrics.num_cached_tokens for o in outs] == [0, leaves, len(a)]
    assert [o.metrics.num_lost_to_retention for o in outs] == [0, 0, 0]
    assert all(o.metrics.num_lost_to_alignment == 0 for o in outs)
    reference = make_hybrid_engine(enable_prefix_caching=False).generate([a, b, c], params)
    assert [o.token_ids for o in outs] == [r.token_ids for r in reference]
