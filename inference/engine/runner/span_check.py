"""Does a scheduled request's block table cover what its step reads and writes? Checked per
request before the step is built, so a request whose state is inconsistent fails alone (a
RequestNotComputed: the scheduler forgets its uncomputed blocks) and the others step.

What a step of positions [start, end) needs:
- full group: a block for every position before `end` (attention and compressed entries read
  the whole prefix);
- sliding group: a block for every position from the first the window reads,
  max(start - W + 1, replay start, 0), to end - 1 (sliding_window_manager.first_needed_block
  keeps exactly these).
"""

from __future__ import annotations

from inference.engine.scheduler_output import ScheduledRequest


def span_error(scheduled: ScheduledRequest, block_size: int, window: int | None) -> str | None:
    """Why `scheduled`'s blocks do not cover its step, or None when they do."""
    request = scheduled.request
    start = request.num_computed_tokens
    end = start + scheduled.num_new_tokens
    last = (end - 1) // block_size
    what = f"positions {start}..{end - 1}"
    ids = scheduled.block_ids
    if len(ids) <= last or any(block_id < 0 for block_id in ids[: last + 1]):
        return (
            f"its full-group blocks ({len(ids)}, ids {ids[: last + 1]}) do not cover {what}: "
            "its state is inconsistent with its scheduled span"
        )
    if window is None or scheduled.window_block_ids is None:
        return None
    first, window_ids = scheduled.window_block_ids
    lo = max(start - window + 1, request.replay_start or 0, 0) // block_size
    held = window_ids[lo - first : last + 1 - first] if lo >= first else []
    if len(held) != last + 1 - lo or any(block_id < 0 for block_id in held):
        return (
            f"its window blocks (from block {first}, {len(window_ids)} blocks) do not hold "
            f"blocks {lo}..{last} of {what}: its state is inconsistent with its scheduled span"
        )
    return None
