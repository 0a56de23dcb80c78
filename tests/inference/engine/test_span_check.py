"""runner/span_check.py: which block tables cover a step's span (exact, block by block)."""

from __future__ import annotations

from types import SimpleNamespace

from inference.engine.runner.span_check import span_error
from inference.engine.scheduler_output import ScheduledRequest

SIZE, WINDOW = 4, 8  # the window of position p: p - 7 .. p


def _step(start, num_new, full, window=None, replay_start=None):
    request = SimpleNamespace(num_computed_tokens=start, replay_start=replay_start)
    return ScheduledRequest(request, num_new, full, window)


def test_a_decode_needs_every_full_block_and_the_window_blocks_it_reads():
    # position 13 reads 6..13: blocks 1..3 of the window; blocks 0..3 of the full group
    assert span_error(_step(13, 1, [5, 6, 7, 8], (1, [2, 3, 4])), SIZE, WINDOW) is None
    assert "full-group blocks" in span_error(_step(13, 1, [5, 6, 7], (1, [2, 3, 4])), SIZE, WINDOW)
    assert "full-group blocks" in span_error(_step(13, 1, [5, -1, 7, 8], None), SIZE, WINDOW)
    missing_first = span_error(_step(13, 1, [5, 6, 7, 8], (2, [3, 4])), SIZE, WINDOW)
    assert "blocks 1..3" in missing_first
    assert span_error(_step(13, 1, [5, 6, 7, 8], (1, [2, -1, 4])), SIZE, WINDOW) is not None
    assert span_error(_step(13, 1, [5, 6, 7, 8], (1, [2, 3])), SIZE, WINDOW) is not None


def test_a_prefill_chunk_and_a_replay_read_from_their_own_start():
    # a chunk of positions 8..15 reads from 1: window blocks 0..3
    assert span_error(_step(8, 8, [1, 2, 3, 4], (0, [1, 2, 3, 4])), SIZE, WINDOW) is None
    assert span_error(_step(8, 8, [1, 2, 3, 4], (1, [2, 3, 4])), SIZE, WINDOW) is not None
    # a bounded replay from 8 has no window state before it: blocks 2..3 are enough
    assert span_error(_step(8, 8, [1, 2, 3, 4], (2, [3, 4]), replay_start=8), SIZE, WINDOW) is None
    # a model without a sliding group checks the full group alone
    assert span_error(_step(8, 8, [1, 2, 3, 4], (2, [])), SIZE, None) is None
