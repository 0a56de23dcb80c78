"""The decode roofline (memory_plan/roofline.py, `python -m benchmarks roofline`) on the tiny
V4 config: its numbers follow from the memory plan's bytes and the distinct-experts formula."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.__main__ import main
from inference.engine.memory_plan import Sharding, model_spec, weight_bytes
from inference.engine.memory_plan.roofline import (
    decode_reads,
    expected_distinct_experts,
    state_read_bytes,
)

TINY = "deepseek-v4-tiny-random"


@pytest.fixture(scope="module")
def spec():
    return model_spec(TINY)


def test_distinct_experts_grow_sub_linearly():
    counts = [expected_distinct_experts(256, 6, n) for n in (1, 2, 4, 16, 1000)]
    assert counts[0] == pytest.approx(6)
    assert counts == sorted(counts)
    assert counts[2] < 4 * 6 and counts[3] < 16 * 6  # tokens share experts
    assert counts[-1] == pytest.approx(256)


def test_a_step_reads_the_dense_weights_once_and_the_experts_it_touches(spec):
    config = spec.config
    ranks = [weight_bytes(spec, torch.bfloat16, Sharding(2, True, r)) for r in (0, 1)]
    one, four = decode_reads(spec, 2, [1, 4], context_tokens=300)
    busiest = max(ranks, key=lambda w: w.total)
    # every layer's experts are alike; the MTP layer's are not read without drafts
    decode_experts = busiest.experts * config.num_layers / (config.num_layers + 1)
    assert config.num_mtp_layers == 1
    for read, n in ((one, 1), (four, 4)):
        touched = expected_distinct_experts(config.num_experts, config.num_experts_per_tok, n)
        assert read.distinct_experts_per_layer == pytest.approx(touched)
        assert read.routed_experts == pytest.approx(decode_experts * touched / config.num_experts)
        assert read.state == n * state_read_bytes(config, 300, 2)
    # the dense part: everything but the experts, less the MTP layer and the embedding rows
    # the tokens skip (half the table on each rank)
    embedding = config.vocab_size * config.hidden_size * 2 // 2
    assert one.dense < busiest.total - busiest.experts - embedding
    assert four.dense - one.dense == pytest.approx(3 * config.hidden_size * 2, rel=0.5)
    assert one.total < four.total < 4 * one.total
    assert four.total_all_ranks > four.total


def test_state_read_grows_with_the_context(spec):
    config = spec.config
    short, long = (state_read_bytes(config, n, 2) for n in (64, 4096))
    assert short < long
    hca = config.attention_kinds.count("heavily_compressed_attention")
    assert hca  # the long context adds HCA entries: 32 a HCA layer over 4096 tokens
    extra_hca = hca * (4096 // config.hca_rate) * config.head_dim * 2
    assert long - short > extra_hca


def test_the_command_prints_the_table_and_json(capsys):
    argv = ["roofline", "--model", TINY, "--in-flight", "1,4", "--context-tokens", "300"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "tok/s/seq" in out and "measured: 5.5 tokens/s" in out
    assert main([*argv, "--bandwidth-gbs", "100", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["in_flight"] for r in rows] == [1, 4]
    for row in rows:
        assert row["step_s"] == pytest.approx(row["rank_bytes"] / 100e9)
        assert row["tps_aggregate"] == pytest.approx(row["in_flight"] / row["step_s"])


def test_a_model_without_routed_experts_is_refused(capsys):
    assert main(["roofline", "--model", "smollm2-tiny-random"]) == 2
    assert "DeepSeek-V4" in capsys.readouterr().err
