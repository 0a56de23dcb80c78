"""Scheduler on tiny configs: token budget, chunked prefill, continuous batching, preemption."""

from inference.engine.core.scheduler import Scheduler
from inference.engine.request import Request, RequestStatus
from inference.engine.request_errors import RequestError
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler_output import SchedulerOutput
from tests.inference.engine.helpers import tiny_kv_cache_manager, tiny_scheduler

BLOCK = 4


def make_scheduler(num_blocks=16, max_num_seqs=4, budget=8) -> Scheduler:
    manager = tiny_kv_cache_manager(num_blocks, BLOCK)
    return tiny_scheduler(manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)


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
        manager = tiny_kv_cache_manager(
            num_blocks,
            BLOCK,
            sliding_window=8,
            retention_interval=8,
            num_sliding_blocks=num_sliding_blocks,
        )
        scheduler = tiny_scheduler(manager, max_num_seqs=4, max_num_batched_tokens=12)
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


# ---- update_from_output: what a step's sampled tokens do to its requests -------------------


def scheduler_with_stops(tokenizer, num_blocks=16, budget=64, max_model_len=None) -> Scheduler:
    manager = tiny_kv_cache_manager(num_blocks, BLOCK)
    return tiny_scheduler(
        manager,
        max_num_seqs=4,
        max_num_batched_tokens=budget,
        tokenizer=tokenizer,
        max_model_len=max_model_len,
    )


def sampled_for(output: SchedulerOutput, token: int) -> dict[str, int]:
    """What the runner returns: a token for each request whose prompt is done this step."""
    return {
        s.request.request_id: token
        for s in output.scheduled
        if s.request.num_computed_tokens + s.num_new_tokens == s.request.num_tokens
    }


def test_update_from_output_appends_tokens_and_finishes_at_max_tokens(tiny_engine):
    scheduler = scheduler_with_stops(tiny_engine.tokenizer, budget=8)
    a = Request("a", list(range(100, 112)), SamplingParams(max_tokens=2, ignore_eos=True))
    scheduler.add_request(a)
    out = scheduler.schedule()  # 8 of 12 prompt tokens: nothing sampled
    assert scheduler.update_from_output(out, sampled_for(out, 7)) == []
    assert a.num_computed_tokens == 8 and a.output_token_ids == []
    out = scheduler.schedule()
    assert scheduler.update_from_output(out, sampled_for(out, 7)) == []
    assert a.num_computed_tokens == 12 and a.output_token_ids == [7]
    out = scheduler.schedule()
    assert scheduler.update_from_output(out, sampled_for(out, 9)) == [a]
    assert a.status == RequestStatus.FINISHED_LENGTH and a.output_token_ids == [7, 9]
    assert not scheduler.has_unfinished()
    assert scheduler.kv_cache_manager.usage() == 0.0


def test_update_from_output_stops_on_a_stop_token_unless_eos_is_ignored(tiny_engine):
    tokenizer = tiny_engine.tokenizer
    stop = min(tokenizer.stop_token_ids)
    scheduler = scheduler_with_stops(tokenizer)
    a = Request("a", list(range(100, 104)), SamplingParams(max_tokens=4))
    b = Request("b", list(range(200, 204)), SamplingParams(max_tokens=4, ignore_eos=True))
    scheduler.add_request(a)
    scheduler.add_request(b)
    out = scheduler.schedule()
    assert scheduler.update_from_output(out, sampled_for(out, stop)) == [a]
    assert a.status == RequestStatus.FINISHED_STOPPED
    assert scheduler.running == [b] and b.output_token_ids == [stop]


def test_update_from_output_stops_on_a_stop_string(tiny_engine):
    tokenizer = tiny_engine.tokenizer
    pieces = tokenizer.encode(" the bell rings")
    scheduler = scheduler_with_stops(tokenizer)
    a = Request("a", list(range(100, 104)), SamplingParams(max_tokens=20, stop=["bell"]))
    scheduler.add_request(a)
    for token in pieces:
        out = scheduler.schedule()
        if scheduler.update_from_output(out, sampled_for(out, token)):
            break
    assert a.status == RequestStatus.FINISHED_STOPPED
    assert "bell" in tokenizer.decode(a.output_token_ids)
    assert "bell" not in tokenizer.decode(a.output_token_ids[:-1])


def test_update_from_output_finishes_at_the_model_length(tiny_engine):
    scheduler = scheduler_with_stops(tiny_engine.tokenizer, max_model_len=6)
    a = Request("a", list(range(100, 104)), SamplingParams(max_tokens=20, ignore_eos=True))
    scheduler.add_request(a)
    steps = 0
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        scheduler.update_from_output(out, sampled_for(out, 5))
        steps += 1
    assert steps == 2 and a.num_tokens == 6 and a.status == RequestStatus.FINISHED_LENGTH


def test_a_failed_token_finishes_its_request_alone(tiny_engine):
    scheduler = scheduler_with_stops(tiny_engine.tokenizer)
    a = Request("a", list(range(100, 104)), SamplingParams(max_tokens=4, ignore_eos=True))
    b = Request("b", list(range(200, 204)), SamplingParams(max_tokens=4, ignore_eos=True))
    scheduler.add_request(a)
    scheduler.add_request(b)
    out = scheduler.schedule()
    sampled = {"a": 5, "b": RequestError("its grammar failed: boom")}
    assert scheduler.update_from_output(out, sampled) == [b]
    assert b.status == RequestStatus.FINISHED_ABORTED
    assert isinstance(b.error, RequestError) and "request b failed in the engine" in str(b.error)
    assert scheduler.running == [a] and a.output_token_ids == [5] and a.error is None


def test_a_failed_step_finishes_what_it_ran_and_forgets_its_blocks(tiny_engine):
    scheduler = scheduler_with_stops(tiny_engine.tokenizer, budget=8)
    a = Request("a", list(range(100, 108)), SamplingParams(max_tokens=4))
    b = Request("b", list(range(200, 208)), SamplingParams(max_tokens=4))
    scheduler.add_request(a)
    scheduler.add_request(b)
    out = scheduler.schedule()  # the budget holds a only; b waits
    assert scheduler.fail_step(out, RuntimeError("device lost")) == [a]
    assert a.status == RequestStatus.FINISHED_ABORTED and "device lost" in str(a.error)
    assert list(scheduler.waiting) == [b] and b.error is None
    # a's blocks were never written: a request with the same prompt finds nothing cached.
    again = Request("c", list(range(100, 108)), SamplingParams(max_tokens=4))
    assert scheduler.kv_cache_manager.get_computed_blocks(again)[1] == 0


def test_finish_requests_finishes_only_the_named_ones():
    scheduler = make_scheduler(max_num_seqs=1)
    for rid in "abc":
        scheduler.add_request(request(rid, 3, start=ord(rid) * 10))
    scheduler.schedule()  # a runs, b and c wait
    found = scheduler.finish_requests(["c", "a", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert [r.request_id for r in found] == ["a", "c"]
    assert scheduler.running == [] and [r.request_id for r in scheduler.waiting] == ["b"]


def test_make_stats_is_a_snapshot_of_the_queues_and_counters():
    scheduler = make_scheduler(num_blocks=4, budget=64)
    scheduler.add_request(request("a", 8))
    scheduler.add_request(request("b", 8, start=50))
    scheduler.add_request(request("c", 3, start=90))
    out = scheduler.schedule()
    run_step(scheduler, out)
    scheduler.schedule()  # b is preempted
    stats = scheduler.make_stats()
    assert (stats.num_running, stats.num_waiting, stats.num_preemptions) == (1, 2, 1)
    assert stats.num_prefill_tokens == 16 and stats.num_forced_tokens == 0
    assert stats.reuse_sources == {"none": 2}
    stats.reuse_sources["none"] = 99  # a copy: the scheduler's own count is untouched
    assert scheduler.make_stats().reuse_sources == {"none": 2}


def test_prefill_chunks_are_capped_while_a_request_decodes():
    manager = tiny_kv_cache_manager(32, BLOCK)
    scheduler = tiny_scheduler(
        manager, max_num_seqs=4, max_num_batched_tokens=16, prefill_chunk_while_decoding=4
    )
    scheduler.add_request(request("a", 6))
    out = scheduler.schedule()
    assert plan(out) == [("a", 6)]  # nothing decodes yet: the whole budget
    run_step(scheduler, out)
    scheduler.add_request(request("b", 10, start=100))
    steps = []
    for _ in range(3):
        out = scheduler.schedule()
        steps.append(plan(out))
        run_step(scheduler, out)
    # a decodes every step; b's prompt comes in chunks of 4 beside it.
    assert steps == [[("a", 1), ("b", 4)], [("a", 1), ("b", 4)], [("a", 1), ("b", 2)]]
