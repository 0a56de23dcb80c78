"""Scheduler priority (vLLM's priority policy) on tiny configs: a lower value is served first,
FCFS within a class; worse classes give up seats and blocks first."""

import pytest

from inference.engine.core.scheduler import Scheduler
from inference.engine.request import Request
from inference.engine.sampling_params import SamplingParams
from tests.inference.engine.helpers import tiny_kv_cache_manager, tiny_scheduler
from tests.inference.engine.test_scheduler import BLOCK, plan, run_step


def make_scheduler(num_blocks=16, max_num_seqs=4, budget=64) -> Scheduler:
    manager = tiny_kv_cache_manager(num_blocks, BLOCK)
    return tiny_scheduler(manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)


def request(rid: str, num_tokens: int, priority: int, start: int = 0) -> Request:
    tokens = list(range(start, start + num_tokens))
    return Request(rid, tokens, SamplingParams(max_tokens=8), priority=priority)


def waiting(scheduler: Scheduler) -> list[str]:
    return [r.request_id for r in scheduler.waiting]


def running(scheduler: Scheduler) -> list[str]:
    return [r.request_id for r in scheduler.running]


def test_waiting_requests_are_admitted_by_class_then_arrival():
    scheduler = make_scheduler(max_num_seqs=2)
    for rid, priority in [("c", 1), ("a", 0), ("d", 1), ("b", 0)]:
        scheduler.add_request(request(rid, 3, priority, start=ord(rid) * 10))
    assert waiting(scheduler) == ["a", "b", "c", "d"]
    assert plan(scheduler.schedule()) == [("a", 3), ("b", 3)]
    assert waiting(scheduler) == ["c", "d"]


def test_a_better_class_takes_the_budget_before_a_worse_running_prefill():
    scheduler = make_scheduler(budget=8)
    scheduler.add_request(request("town", 40, priority=1))
    run_step(scheduler, scheduler.schedule())  # town has 8 of its 40 prompt tokens
    scheduler.add_request(request("script", 6, priority=0, start=100))
    out = scheduler.schedule()
    # While the script prefills, the town's prompt waits (its decode tokens would not).
    assert plan(out) == [("script", 6)]
    assert running(scheduler) == ["script", "town"]
    run_step(scheduler, out)
    assert plan(scheduler.schedule()) == [("script", 1), ("town", 7)]


def test_a_worse_class_keeps_decoding_while_a_better_one_prefills():
    scheduler = make_scheduler(budget=8)
    scheduler.add_request(request("town", 6, priority=1))
    scheduler.add_request(request("town2", 20, priority=1, start=200))
    run_step(scheduler, scheduler.schedule())  # town is decoding, town2 has 2 of 20
    scheduler.add_request(request("script", 6, priority=0, start=100))
    assert plan(scheduler.schedule()) == [("script", 6), ("town", 1)]


def test_with_one_class_the_order_is_plain_fcfs():
    scheduler = make_scheduler(budget=8)
    scheduler.add_request(request("first", 40, priority=0))
    run_step(scheduler, scheduler.schedule())
    scheduler.add_request(request("second", 6, priority=0, start=100))
    assert plan(scheduler.schedule()) == [("first", 8)]


def test_a_better_waiting_request_takes_the_seat_of_the_newest_worse_one():
    scheduler = make_scheduler(max_num_seqs=2)
    scheduler.add_request(request("lo1", 3, priority=1))
    scheduler.add_request(request("lo2", 3, priority=1, start=10))
    scheduler.add_request(request("lo3", 3, priority=1, start=20))
    run_step(scheduler, scheduler.schedule())
    scheduler.add_request(request("hi", 3, priority=0, start=30))
    out = scheduler.schedule()
    assert out.preempted_ids == ["lo2"]
    assert plan(out) == [("hi", 3), ("lo1", 1)]
    # lo2 was admitted before lo3, so it waits ahead of it.
    assert waiting(scheduler) == ["lo2", "lo3"]
    assert scheduler.waiting[0].num_preemptions == 1


def test_a_better_waiting_request_preempts_worse_ones_when_blocks_run_out():
    scheduler = make_scheduler(num_blocks=4)
    scheduler.add_request(request("lo1", 7, priority=2))
    run_step(scheduler, scheduler.schedule())
    scheduler.add_request(request("lo2", 7, priority=1, start=10))
    out = scheduler.schedule()
    assert plan(out) == [("lo2", 7), ("lo1", 1)]  # each holds 2 blocks now: the pool is full
    run_step(scheduler, out)
    scheduler.add_request(request("hi", 6, priority=0, start=20))
    out = scheduler.schedule()
    # The worst class goes first (lo1, though admitted first); lo2 still fits its next token.
    assert out.preempted_ids == ["lo1"]
    assert plan(out) == [("hi", 6), ("lo2", 1)]
    assert waiting(scheduler) == ["lo1"]


def test_out_of_blocks_a_running_worse_class_is_preempted_before_a_newer_better_one():
    scheduler = make_scheduler(num_blocks=4)
    scheduler.add_request(request("lo", 7, priority=1))
    run_step(scheduler, scheduler.schedule())
    scheduler.add_request(request("hi", 8, priority=0, start=50))
    out = scheduler.schedule()
    assert plan(out) == [("hi", 8), ("lo", 1)]  # the pool is full now
    run_step(scheduler, out)
    out = scheduler.schedule()
    # Both need a third block; FCFS would preempt hi (the newest), priority preempts lo.
    assert out.preempted_ids == ["lo"]
    assert plan(out) == [("hi", 1)]


def test_a_preempted_request_waits_behind_better_classes():
    scheduler = make_scheduler(max_num_seqs=1)
    scheduler.add_request(request("lo", 3, priority=1))
    run_step(scheduler, scheduler.schedule())
    scheduler.add_request(request("hi1", 3, priority=0, start=10))
    scheduler.add_request(request("hi2", 3, priority=0, start=20))
    out = scheduler.schedule()
    assert out.preempted_ids == ["lo"] and plan(out) == [("hi1", 3)]
    assert waiting(scheduler) == ["hi2", "lo"]


def test_the_engine_takes_a_priority_and_reports_it(tiny_engine):
    params = SamplingParams(max_tokens=2)
    (out,) = tiny_engine.generate([[1, 2, 3]], params, priority=-3)
    assert out.metrics.priority == -3
    deltas = list(tiny_engine.generate_stream([1, 2, 3], params, priority=5))
    assert deltas[-1].output.metrics.priority == 5
    with pytest.raises(ValueError, match="priority must be an int"):
        tiny_engine.generate([[1, 2, 3]], params, priority="high")
