"""One prefill per shared head: which waiting requests should wait for a leader's prefill.

When requests that arrive together share a head the cache does not hold yet, prefilling it
once per request wastes the step (and, on a hybrid model with a coarse retention grid, the
followers could not even reuse the leader's work: no checkpoint where the head ends). Instead
the first of them leads: it computes the head and keeps a checkpoint exactly where the shared
part ends (a junction); the others are held until that point is computed, then resume there.

A follower is held only while its leader is still short of the shared point; a leader that is
preempted goes back to the queue head and leads again. Nothing waits on a request that cannot
progress, so holding cannot deadlock, and a held request delays no one behind it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from inference.engine.request import Request


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _is_ahead(leader: Request, shared: int, block_size: int, junctions: Sequence[int]) -> bool:
    """The leader has not computed the shared part yet: it has not reached it (it will keep a
    checkpoint there), or it passed it with that checkpoint set (among its `junctions`) and the
    block holding it is not full yet (the checkpoint is recorded when it is, or when the
    leader's prompt ends)."""
    if leader.num_computed_tokens < shared:
        return True
    ready_at = min(-(-shared // block_size) * block_size, leader.num_prompt_tokens)
    return shared in junctions and leader.num_computed_tokens < ready_at


def find_followers(
    prefilling: list[Request],
    waiting: list[Request],
    block_size: int,
    junctions: Mapping[str, Sequence[int]],
) -> dict[str, tuple[Request, int]]:
    """{follower id: (leader, shared length)} for the waiting requests (in queue order) whose
    longest shared head with a request ahead of them (running and still prefilling, or
    earlier in the queue and not itself a follower) is at least a block and not computed yet.
    `junctions`: request id → where it keeps its window state (the scheduler's).
    """
    leaders = list(prefilling)
    arrays = {r.request_id: np.asarray(r.prompt_token_ids) for r in (*prefilling, *waiting)}
    followers: dict[str, tuple[Request, int]] = {}
    for request in waiting:
        best, shared = None, 0
        for leader in leaders:
            if leader.sampling_params.cache_salt != request.sampling_params.cache_salt:
                continue
            n = common_prefix_length(arrays[leader.request_id], arrays[request.request_id])
            # The follower recomputes at least its last token; the leader keeps only its prompt.
            n = min(n, request.num_prompt_tokens - 1, leader.num_prompt_tokens)
            if n > shared:
                best, shared = leader, n
        # Ready once the block holding the shared point is full (its checkpoint is keyed by
        # that block's hash) or the leader's prompt is done.
        if (
            best is not None
            and shared >= block_size
            and _is_ahead(best, shared, block_size, junctions.get(best.request_id, ()))
        ):
            followers[request.request_id] = (best, shared)
        else:
            leaders.append(request)
    return followers
