"""block_runs / first_difference: the vectorized block-table scans of the torch path."""

from inference.engine.attention.block_runs import block_runs, first_difference
from inference.engine.attention.decode_windows import slot_runs


def test_block_runs_split_where_ids_stop_being_consecutive():
    assert block_runs([]) == []
    assert block_runs([7]) == [(0, 1)]
    assert block_runs([3, 4, 5, 9, 10, 2]) == [(0, 3), (3, 5), (5, 6)]


def test_first_difference_is_the_shared_leading_length():
    assert first_difference([[1, 2, 3, 4], [1, 2, 9, 4], [1, 2, 3]], limit=3) == 2
    assert first_difference([[1, 2], [1, 2]], limit=2) == 2
    assert first_difference([[1], [2]], limit=0) == 0


def _slot_runs_block_by_block(block_ids, num_slots, block_size, first=0, lowest=0):
    """The per-block loop slot_runs replaced, kept as its reference."""
    runs = []
    for index in range(max(lowest // block_size, first), -(-num_slots // block_size)):
        base = block_ids[index - first] * block_size
        start = base + max(0, lowest - index * block_size)
        end = base + min(block_size, num_slots - index * block_size)
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((start, end))
    return runs


def test_slot_runs_match_the_block_by_block_reference():
    table = [0, 1, 2, 10, 11, 5, 6, 7, 20]
    for num_slots in (1, 4, 5, 17, 33, 36):
        for lowest in (0, 3, 4, 9):
            if lowest < num_slots:
                expected = _slot_runs_block_by_block(table, num_slots, 4, 0, lowest)
                assert slot_runs(table, num_slots, 4, 0, lowest) == expected
    window_table = [11, 5, 6, 7]  # a sliding table starting at block 3
    expected = _slot_runs_block_by_block(window_table, 27, 4, first=3, lowest=14)
    assert slot_runs(window_table, 27, 4, first=3, lowest=14) == expected
