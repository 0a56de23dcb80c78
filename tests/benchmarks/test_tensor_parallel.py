"""benchmarks.tensor_parallel's summary: steps split by kind, medians of time, means of bytes."""

from benchmarks.tensor_parallel import StepTiming, format_rows, summarize
from inference.engine.distributed.communicator import CommStats, OpStats


def _comm(all_reduce_bytes: int, seconds: float) -> CommStats:
    return CommStats(
        {
            "all_reduce": OpStats(61, all_reduce_bytes, seconds),
            "broadcast": OpStats(2, 400, 0.0),
        }
    )


def test_summary_splits_prefill_from_decode_and_counts_bytes_per_step():
    steps = [
        StepTiming("prefill", 256, 2.0, _comm(256 * 2304 * 61, 0.5)),
        StepTiming("decode", 1, 0.10, _comm(2304 * 61, 0.02)),
        StepTiming("decode", 1, 0.30, _comm(2304 * 61, 0.04)),
        StepTiming("decode", 1, 0.20, _comm(2304 * 61, 0.03)),
    ]
    prefill, decode = summarize("2 ranks", steps)
    assert (prefill.kind, prefill.num_steps, prefill.tokens_per_step) == ("prefill", 1, 256)
    assert prefill.comm_bytes == 256 * 2304 * 61 + 400
    assert (decode.num_steps, decode.step_ms, decode.comm_ms) == (3, 200.0, 30.0)
    assert decode.bytes_by_op == {"all_reduce": 2304 * 61, "broadcast": 400}
    assert decode.comm_calls == 63
    assert "2 ranks" in format_rows([prefill, decode])


def test_a_single_process_has_no_communication():
    (decode,) = summarize("1 process", [StepTiming("decode", 1, 0.25, None)])
    assert (decode.comm_ms, decode.comm_bytes, decode.bytes_by_op) == (0.0, 0.0, {})
