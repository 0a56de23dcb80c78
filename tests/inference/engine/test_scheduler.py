"""Scheduler on tiny configs: token budget, chunked prefill, continuous batching, preemption."""

from inference.engine.kv_cache_manager import KVCacheManager
from inference.engine.request import Request, RequestStatus
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import Scheduler, SchedulerOutput

BLOCK = 4


def make_scheduler(num_blocks=16, max_num_seqs=4, budget=8) -> Scheduler:
    manager = KVCacheManager(num_blocks, BLOCK, True, model_fingerprint="test")
    return Scheduler(manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)


def request(rid: str, num_tokens: int, start: int = 0) -> Request:
    return Request(rid, list(range(start, start + num_tokens)), SamplingParams(max_tokens=8))


def run_step(scheduler: Scheduler, output: SchedulerOutput, token: int = 1) -> None:
    """What the engine does after the model ran: advance, append a token when prefill is done."""
    for scheduled in output.scheduled:
        r = scheduled.request
        r.num_computed_tokens += scheduled.num_new_tokens
        if r.num_computed_tokens == r.num_tokens:
            r.append_output_token(token, 0.0)


def plan(output: SchedulerOutput) -> list[tuple[str, int]]:
    return [(s.request.request_id, s.num_new_tokens) for s in output.scheduled]


def test_long_prompt_is_prefilled_in_chunks_under_the_budget():
    scheduler = make_scheduler(budget=8)
    scheduler.add_request(request("a", 20))
    steps = []
    for _ in range(4):
        out = scheduler.schedule()
        steps.append(plan(out))
        run_step(scheduler, out)
    assert steps == [[("a", 8)], [("a", 8)], [("a", 4)], [("a", 1)]]


def test_requests_join_and_leave_between_steps():
    scheduler = make_scheduler(budget=8)
    scheduler.add_request(request("a", 6))
    out = scheduler.schedule()
    assert plan(out) == [("a", 6)]
    run_step(scheduler, out)
    scheduler.add_request(request("b", 5, start=100))
    out = scheduler.schedule()
    # a decodes one token, b gets the rest of the budget.
    assert plan(out) == [("a", 1), ("b", 5)]
    run_step(scheduler, out)
    scheduler.finish(scheduler.running[0], RequestStatus.FINISHED_STOPPED)
    assert plan(scheduler.schedule()) == [("b", 1)]


def test_max_num_seqs_bounds_the_batch():
    scheduler = make_scheduler(max_num_seqs=2, budget=64)
    for rid in "abc":
        scheduler.add_request(request(rid, 3, start=ord(rid) * 10))
    assert [r for r, _ in plan(scheduler.schedule())] == ["a", "b"]
    assert [r.request_id for r in scheduler.waiting] == ["c"]


def test_second_request_reuses_blocks_of_the_first_in_the_same_step():
    scheduler = make_scheduler(budget=64)
    scheduler.add_request(request("a", 10))
    scheduler.add_request(request("b", 10))
    out = scheduler.schedule()
    assert plan(out) == [("a", 10), ("b", 2)]
    assert out.scheduled[1].block_ids[:2] == out.scheduled[0].block_ids[:2]
    assert scheduler.running[1].num_cached_tokens == 8


def test_out_of_blocks_preempts_the_newest_request_and_recomputes_it_later():
    scheduler = make_scheduler(num_blocks=4, budget=64)
    scheduler.add_request(request("a", 8))
    scheduler.add_request(request("b", 8, start=50))
    out = scheduler.schedule()
    assert plan(out) == [("a", 8), ("b", 8)]
    run_step(scheduler, out)
    # Both need a third block for their next token; only one can have it.
    out = scheduler.schedule()
    assert plan(out) == [("a", 1)]
    assert out.preempted_ids == ["b"]
    b = scheduler.waiting[0]
    assert b.request_id == "b" and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert b.output_token_ids == [1]  # kept; recomputed with the prompt when resumed
    run_step(scheduler, out)
    scheduler.finish(scheduler.running[0], RequestStatus.FINISHED_STOPPED)
    out = scheduler.schedule()
    # b comes back: its first prompt block is still cached; 9 tokens, 4 of them hit.
    assert plan(out) == [("b", 5)]


def test_request_that_never_fits_alone_is_preempted_not_crashed():
    scheduler = make_scheduler(num_blocks=2, budget=64)
    scheduler.add_request(request("a", 8))
    out = scheduler.schedule()
    run_step(scheduler, out)
    out = scheduler.schedule()
    assert out.scheduled == [] and out.preempted_ids == ["a"]


def drive_to_completion(scheduler: Scheduler, requests: list[Request], max_steps=2000) -> int:
    """Run the schedule → step loop until every request has its tokens; returns the steps."""
    for r in requests:
        scheduler.add_request(r)
    steps = 0
    while scheduler.has_unfinished():
        steps += 1
        assert steps < max_steps, "no progress"
        out = scheduler.schedule()
        run_step(scheduler, out, token=steps % 50)
        for r in list(scheduler.running):
            if len(r.output_token_ids) >= r.sampling_params.max_tokens:
                scheduler.finish(r, RequestStatus.FINISHED_LENGTH)
    return steps


def test_two_kv_groups_survive_pressure_on_either_pool():
    import random

    rng = random.Random(7)
    head = list(range(1000, 1040))
    for num_blocks, num_sliding_blocks in [(40, 6), (14, 40)]:
        manager = KVCacheManager(
            num_blocks,
            BLOCK,
            True,
            model_fingerprint="test",
            sliding_window=8,
            retention_interval=8,
            num_sliding_blocks=num_sliding_blocks,
        )
        scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=12)
        requests = [
            Request(str(i), head[: rng.randrange(4, 40)] + [i] * rng.randrange(1, 12),
                    SamplingParams(max_tokens=rng.randrange(1, 10)))
            for i in range(12)
        ]  # fmt: skip
        drive_to_completion(scheduler, requests)
        assert all(len(r.output_token_ids) == r.sampling_params.max_tokens for r in requests)
        assert all(r.metrics().num_cached_tokens % BLOCK == 0 for r in requests)
        # Nothing held once all are done: every block is back in its free queue.
        assert manager.block_pool.num_free_blocks == num_blocks
        assert manager.sliding.block_pool.num_free_blocks == num_sliding_blocks
        assert scheduler.num_preemptions > 0
